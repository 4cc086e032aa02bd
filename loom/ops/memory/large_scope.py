"""memory.search of a large scope (above facts.SCAN_MAX_FACTS live facts) from an index
kept in the API process (loom.store.memory_index).

A user holding ~100k facts costs the server-side legs ~180 ms of engine CPU a search.
Such a user is searched again and again (an agent talking to them), and their facts
change far less often than they are searched: so the process keeps an index of the
scope (unit vectors as one matrix, an inverted index of terms, validity, ids) and ranks
both legs here, exactly as the server does, for any query. Then only the hits' rows are
read (one round trip by primary key) and checked against their newest versions.

Currency is the one-read cache's (loom.ops.memory.scan_cache): the index is stored
under the Redis tokens read *before* it was read, and used only while both tokens
still equal them (every durable write of the user's facts changes one), and for at
most scan_cache.MAX_AGE_S (read again in the background after REFRESH_AFTER_S while
it still answers). A search that finds no current index is ranked by the server as
before, and starts the index's read in the background (at most one per process at a
time, and per scope not more often than FILL_INTERVAL_S: a scope written to constantly
is not re-read on every write). The hits' rows are read and checked (not forgotten, not
superseded, valid now, in the scope, not high): an index that missed a write can miss a
new fact for as long as its token proves it current, never answer a gone one. The index is two reads (the facts
without their text, the user's postings by term) and numpy work, off the search's path.

The index lives in its own budget, LOOM_MEMORY_LARGE_SCOPE_CACHE_MB (least recently
used scopes out first; a scope larger than the whole budget is not kept and not
re-read for REFUSED_RETRY_S); 0 turns the path off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from loom.clock import utcnow
from loom.ops.memory import scan_cache
from loom.ops.memory.scan_cache import ScanCache
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import memories as store
from loom.store import memory_index
from loom.store.memories import Fact, Scope
from loom.store.memory_index import ScopeIndex

log = logging.getLogger(__name__)

_KEY = "memory.large_scope_cache"
_FILLS = "memory.large_scope_fills"
FILL_INTERVAL_S = 10.0
# A current index older than this is read again in the background while it still
# answers, so a scope searched at least this often never meets scan_cache.MAX_AGE_S.
REFRESH_AFTER_S = scan_cache.MAX_AGE_S / 2
REFUSED_RETRY_S = 600.0


def cache_of(svc: Services) -> ScanCache[ScopeIndex] | None:
    return scan_cache.sized_cache(svc, _KEY, svc.settings.memory_large_scope_cache_mb)


@dataclass
class Fills:
    """The process's index reads: the one in flight, and when each scope may be read again."""

    task: asyncio.Task[None] | None = None
    next_at: dict[Scope, float] = field(default_factory=dict)


def fills_of(svc: Services) -> Fills:
    found = svc.extras.get(_FILLS)
    if not isinstance(found, Fills):
        found = svc.extras[_FILLS] = Fills()
    return found


async def current(svc: Services, scope: Scope) -> ScopeIndex | None:
    """The scope's index if this process holds a current one; otherwise None, and its read
    is started in the background (when allowed: module docstring)."""
    cache = cache_of(svc)
    if cache is None:
        return None
    label = await scan_cache.label(svc, scope)  # before any read: scan_cache's docstring
    index = cache.get(scope, label)
    entry = cache.entries.get(scope)
    if index is None or (entry is not None and time.monotonic() - entry.at > REFRESH_AFTER_S):
        start_fill(svc, scope)  # missing, or read again ahead of its retirement
    return index


def start_fill(svc: Services, scope: Scope) -> None:
    """Start reading the scope's index in the background, unless one read is in flight,
    the scope was read too recently, or the path is off."""
    if cache_of(svc) is None:
        return
    fills = fills_of(svc)
    now = time.monotonic()
    if (fills.task is not None and not fills.task.done()) or fills.next_at.get(scope, 0.0) > now:
        return
    fills.next_at[scope] = now + FILL_INTERVAL_S
    if len(fills.next_at) > 4096:  # forget the oldest scopes' retry times
        for old in list(fills.next_at)[:1024]:
            fills.next_at.pop(old, None)
    fills.task = asyncio.ensure_future(fill(svc, scope))


async def fill(svc: Services, scope: Scope) -> None:
    """Read the scope's index and keep it under the tokens read before the read."""
    cache = cache_of(svc)
    if cache is None:
        return
    try:
        label = await scan_cache.label(svc, scope)
        index = await svc.run(memory_index.read, svc.ch, scope, now=utcnow())
    except Exception:  # the searches go on with the server's legs
        log.exception("memory.search: reading a large scope's index failed")
        return
    if not cache.put(scope, label, index):
        fills_of(svc).next_at[scope] = time.monotonic() + REFUSED_RETRY_S


async def settle(svc: Services) -> None:
    """Wait for the index read in flight, if any (tests, the bench)."""
    task = fills_of(svc).task
    if task is not None:
        await asyncio.shield(task)


@dataclass
class Fused:
    memory_id: str
    score: float
    legs: list[str]
    similarity: float | None
    bm25: float | None


async def rows(
    svc: Services, scope: Scope, ranked: Sequence[Fused], *, limit: int
) -> list[tuple[Fused, Fact]]:
    """The first `limit` fused hits whose newest version is current and in the scope,
    with their rows: read by id in batches (the index is current, so the first batch
    nearly always suffices; a hit its row contradicts is dropped)."""
    out: list[tuple[Fused, Fact]] = []
    at = utcnow()
    batch = max(limit + 5, 2 * limit)
    pos = 0
    while len(out) < limit and pos < len(ranked):
        part = ranked[pos : pos + batch]
        pos += batch
        got = await svc.run(store.newest, svc.ch, scope.namespace, scope.user_id, [h.memory_id for h in part])
        for h in part:
            f = got.get(h.memory_id)
            if f is not None and _current(f, scope, at):
                out.append((h, f))
                if len(out) == limit:
                    break
    return out


def _current(f: Fact, scope: Scope, at: datetime) -> bool:
    return (
        not f.tombstoned
        and not reads_as_high(f.text)  # refused when set: a second guard
        and not f.superseded_by
        and f.valid_at(at)
        and scope.admits(f.session_id, f.run_id)
    )
