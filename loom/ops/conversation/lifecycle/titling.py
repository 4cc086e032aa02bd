"""The conversation_titler: a periodic pass (started by the worker pool's cron tick
every LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS, read live: titler_tick.py) giving
untitled threads a short LLM-written title, which conversation.threads returns. Every
setting below is live: a pass reads them from ``svc.settings`` when it starts.

- It covers namespaces that record conversations (and whose model calls are switched
  on), threads active in the last LOOM_CONVERSATION_TITLER_WINDOW_HOURS with at least
  LOOM_CONVERSATION_TITLER_MIN_TURNS live turns, at most
  LOOM_CONVERSATION_TITLER_MAX_THREADS_PER_PASS per pass, the most recently active first.
- Off with LOOM_CONVERSATION_TITLER_ENABLED=false, and a pass does nothing with no
  model configured (the fake LLM). One pass at a time across worker processes: a
  Redis lease a pass that finds it taken leaves alone.
- A turn that reads as high is never sent to the model: the prompt carries the plain
  ones of the thread's first eight user and assistant turns. When all eight read as
  high, or the generated title does, the thread stays untitled and its metadata gets
  the ``title_refused`` mark, so no pass asks again; a thread with fewer than eight
  such turns waits, unmarked, for a plain one. conversation.update or create with new
  metadata replaces the mark, and the next pass asks once more.
- The title is written under the thread lease, only if the thread is still untitled
  and its metadata unchanged since it was read (a client's title or metadata wins).
- A pass reads its threads' first turns and rows in one statement each, asks the model
  for up to MODEL_CALLS_AT_ONCE titles at once, and writes them in one insert under
  the threads' leases.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from loom import failures, redis_keys
from loom import logging as loom_logging
from loom.clock import next_version, utcnow
from loom.leases import Lease, LeaseLost, keep_renewed, under_thread_leases
from loom.ops.conversation.common import TITLE_REFUSED
from loom.providers.llm import ChatMessage, LLMError
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import threads as thread_store
from loom.store import titles as store

log = loom_logging.get("loom.conversation.titler")

LEASE_KEY = redis_keys.TITLER_LEASE
LEASE_TTL_MS = 30_000  # renewed at a third of it while the pass runs
FIRST_TURNS = 8  # the turns a title is written from (and the refusal counts)
TURN_CHARS = 1_000  # of each turn, in the prompt
TITLE_CHARS = 120
MODEL_CALLS_AT_ONCE = 4  # a pass's model calls in flight at once
PROMPT = (Path(__file__).parent / "prompts" / "title_system.txt").read_text(encoding="utf-8")


@dataclass(kw_only=True)
class PassReport:
    ran: bool = False
    titled: int = 0
    refused: int = 0
    waiting: int = 0
    failed: int = 0


def _clean(title: str) -> str:
    title = " ".join(title.strip().strip("\"'").split())
    return title[:TITLE_CHARS].rstrip(" .")


@dataclass
class _Decision:
    """What a pass writes for one thread: a title, or the refusal mark."""

    candidate: store.Candidate
    before: thread_store.ThreadRow
    title: str

    @property
    def refuse(self) -> bool:
        return not self.title or reads_as_high(self.title)


async def _ask(svc: Services, text: str) -> str:
    async with asyncio.timeout(svc.settings.llm_timeout_seconds + 5.0):
        return _clean(
            await svc.llm.complete(
                [ChatMessage("system", PROMPT), ChatMessage("user", text)], max_tokens=32, temperature=0.0
            )
        )


async def _decide(
    svc: Services,
    c: store.Candidate,
    turns: list[store.FirstTurn],
    before: thread_store.ThreadRow | None,
    report: PassReport,
    calls: asyncio.Semaphore,
) -> _Decision | None:
    """The title of one thread (asked of the model from its plain first turns), its
    refusal, or None: nothing to write (it waits for a plain turn, or the call failed)."""
    if before is None:
        return None
    plain = [t for t in turns if not t.high]
    if not plain:
        if len(turns) < FIRST_TURNS:
            report.waiting += 1  # fewer than eight turns, all high: wait for a plain one
            return None
        return _Decision(c, before, "")
    text = "\n\n".join(f"[{t.role}] {t.content[:TURN_CHARS]}" for t in plain)
    try:
        async with calls:
            title = await _ask(svc, text)
    except (LLMError, TimeoutError) as exc:
        log.warning("titler model call failed", error=failures.detail(exc))
        report.failed += 1
        return None
    if not title:
        report.failed += 1
        return None
    return _Decision(c, before, title)


def _write_sync(svc: Services, decisions: list[_Decision], report: PassReport) -> None:
    """Under the threads' leases: each title or mark written only when the thread is
    still untitled and its metadata unchanged since it was read (a client's title or
    metadata wins); one read, one insert."""
    now = store.threads_of(svc.ch, [d.candidate for d in decisions])
    rows = []
    for d in decisions:
        cur = now.get(d.candidate)
        if cur is None or cur.tombstoned or cur.title or cur.metadata != d.before.metadata:
            continue
        row = replace(cur, updated_at=utcnow(), version=next_version())
        if d.refuse:
            row.metadata = {**cur.metadata, TITLE_REFUSED: True}
            report.refused += 1
        else:
            row.title = d.title
            report.titled += 1
        rows.append(row)
    if rows:
        thread_store.insert(svc.ch, rows)


async def _write(svc: Services, decisions: list[_Decision], report: PassReport) -> None:
    by_pair: dict[tuple[str, str], list[_Decision]] = {}
    for d in decisions:
        by_pair.setdefault((d.candidate.namespace, d.candidate.thread_id), []).append(d)

    async def work(held: set[tuple[str, str]]) -> None:
        await svc.run(_write_sync, svc, [d for p in sorted(held) for d in by_pair[p]], report)

    await under_thread_leases(svc.redis, by_pair, work)


async def _titles(svc: Services, found: list[store.Candidate], report: PassReport) -> None:
    """The pass's threads at once: their first turns and rows in one statement each, the
    model calls concurrently (MODEL_CALLS_AT_ONCE), the writes in one statement: a pass
    costs a few statements, not a few per thread."""
    turns, before = await asyncio.gather(
        svc.run(store.first_turns_of, svc.ch, found, FIRST_TURNS), svc.run(store.threads_of, svc.ch, found)
    )
    calls = asyncio.Semaphore(MODEL_CALLS_AT_ONCE)
    decided = await asyncio.gather(*(_decide(svc, c, turns[c], before.get(c), report, calls) for c in found))
    decisions = [d for d in decided if d is not None]
    if decisions:
        await _write(svc, decisions, report)


async def titler_pass(svc: Services, namespaces: Sequence[str] | None = None) -> PassReport:
    """One pass (the cron job's body); `namespaces` limits it to those (tests, a
    one-off by hand)."""
    cfg = svc.settings
    report = PassReport()
    if not cfg.conversation_titler_enabled or not svc.llm.configured:
        return report
    lease = Lease(svc.redis, LEASE_KEY, ttl_ms=LEASE_TTL_MS)
    if not await lease.try_acquire():
        return report
    renewer = asyncio.create_task(keep_renewed(lease))
    try:
        report.ran = True
        since = utcnow() - timedelta(hours=cfg.conversation_titler_window_hours)
        found = await svc.run(
            store.candidates,
            svc.ch,
            since,
            cfg.conversation_titler_min_turns,
            cfg.conversation_titler_max_threads_per_pass,
            TITLE_REFUSED,
            namespaces,
        )
        if found:
            await _titles(svc, found, report)
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await renewer
        await lease.release()
    return report


__all__ = ["LEASE_KEY", "PassReport", "titler_pass"]
