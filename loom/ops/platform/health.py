"""health.show (admin): the backends, the job queue, the embedding outcomes and the
append and search rates, in one answer for the dashboard's Health page.

A backend that is down never fails the op: its figures are left out (None) and its
state says "down: <kind>" (the kind of failure only, never the driver's text, which
names internal addresses). Each probe has PROBE_TIMEOUT_S; they run at once.

- backends: ClickHouse (with its version and uptime) and Redis, "ok" or "down: <kind>".
- queue: the arq queue the API and the workers share (see loom.store.queue_state):
  jobs queued (not running; deferred ones included, and counted apart), in progress,
  the age of the longest-waiting due job, and the jobs that failed or succeeded in the
  last `results_window_s` seconds (arq keeps a result that long: the worker's
  keep_result). A figure cut short by a cost cap says "at least".
- embeddings: this API process's append outcomes since it started
  (loom_append_turns_total by outcome, loom_append_embeddings_total by embedding
  outcome), and the embedding rows the token's namespaces had written in the last
  EMBEDDING_WINDOW_S, by outcome (loom.store.health).
- rates: append requests, turns stored and searches per second over the last minute
  (loom.ops.platform.rates), with the window's length.
- read_index: the read index's state ("ok", "off" when none runs, "down"), the memory it
  holds against its budget, what it holds, its lag (publication to application of the
  write events) and its hit rate (namespaces of searches it held, of all it was asked
  for), as its process counts them since it started (loom.read_index.figures).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.errors import Forbidden
from loom.failures import detail
from loom.ops.platform import rates
from loom.queue import QUEUE, RESULTS_KEPT_S
from loom.read_index import figures as read_index
from loom.services import Services
from loom.store import health as store
from loom.store import queue_state

log = loom_logging.get("loom.health")

T = TypeVar("T")

PROBE_TIMEOUT_S = 2.0
EMBEDDING_WINDOW_S = 3600
OK = "ok"


@dataclass(frozen=True)
class Backends:
    clickhouse: str
    redis: str
    clickhouse_version: str | None
    clickhouse_uptime_s: int | None


@dataclass(frozen=True)
class Queue:
    name: str
    queued: int
    deferred: int
    in_progress: int
    in_progress_at_least: bool
    oldest_waiting_s: float | None
    failed: int
    succeeded: int
    results_at_least: bool
    results_window_s: int


@dataclass(frozen=True)
class Embeddings:
    append_outcomes: dict[str, int]  # this process, since it started
    embedding_outcomes: dict[str, int]  # this process, since it started
    rows_window_s: int
    rows: list[store.EmbeddingCount] | None  # None: ClickHouse did not answer


@dataclass(kw_only=True, frozen=True)
class HealthReport:
    status: str  # "ok" | "degraded" (a backend is down)
    backends: Backends
    queue: Queue | None  # None: Redis did not answer
    embeddings: Embeddings
    rates: rates.Rates
    read_index: read_index.Figures


async def probe(aw: Awaitable[T]) -> tuple[str, T | None]:
    """(state, value): ("ok", its value) or ("down: <kind>", None). Never raises."""
    try:
        return OK, await asyncio.wait_for(aw, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # a health probe reports, it never raises
        # The kind of failure only: the driver's text names internal addresses.
        log.warning("health probe failed", error=type(exc).__name__, detail=detail(exc))
        return f"down: {type(exc).__name__}", None


async def check(aw: Awaitable[object]) -> str:
    """ "ok" or "down: <kind>" (GET /healthz's checks)."""
    return (await probe(aw))[0]


def require_admin(who: Principal) -> None:
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot call this op", rule="read_scope")


async def show(svc: Services, who: Principal, *, queue: str = QUEUE) -> HealthReport:
    """health.show (admin, unbounded). `queue` is the arq queue looked at (tests name
    one of their own)."""
    require_admin(who)
    namespaces = list(who.namespaces)
    (ch_state, server), (redis_state, _), (_, q), (_, rows), index = await asyncio.gather(
        probe(svc.run(store.server_info, svc.ch)),
        probe(svc.redis.ping()),
        probe(queue_state.queue_state(svc.arq, queue)),
        probe(svc.run(store.embedding_counts, svc.ch, namespaces, EMBEDDING_WINDOW_S)),
        read_index.read(svc),
    )
    window, totals = rates.SAMPLER.rates()
    return HealthReport(
        status="ok" if ch_state == redis_state == OK else "degraded",
        backends=Backends(
            clickhouse=ch_state,
            redis=redis_state,
            clickhouse_version=server.version if server else None,
            clickhouse_uptime_s=server.uptime_s if server else None,
        ),
        queue=_queue(queue, q),
        embeddings=Embeddings(
            append_outcomes=_ints(totals.appended),
            embedding_outcomes=_ints(totals.embeddings),
            rows_window_s=EMBEDDING_WINDOW_S,
            rows=rows,
        ),
        rates=window,
        read_index=index,
    )


def _queue(name: str, q: queue_state.QueueState | None) -> Queue | None:
    if q is None:
        return None
    return Queue(
        name=name,
        queued=q.queued,
        deferred=q.deferred,
        in_progress=q.in_progress,
        in_progress_at_least=q.in_progress_at_least,
        oldest_waiting_s=None if q.oldest_waiting_s is None else round(q.oldest_waiting_s, 1),
        failed=q.failed,
        succeeded=q.succeeded,
        results_at_least=q.results_at_least,
        results_window_s=RESULTS_KEPT_S,
    )


def _ints(counts: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in sorted(counts.items())}
