"""Per-thread marks that tell conversation.search which vector rows it may answer from
as they are, and which it must verify against ClickHouse.

A vector row (conversation_vectors_<dim>) is a copy of an embedding row, taken when the
row was inserted. It goes stale only when something later rewrites or removes that
turn or its embedding row: a save (claims the owner), an unsave (may remove the turn),
a re-embed (a newer version), deletion and compaction, a retention TTL. Verification
reads the newest embedding and transcript rows of each candidate: two statements, ~10 ms
of a 100k-turn search's ~30 (bench/results/2026-12-01-*-search.txt).

So every such writer raises the marks of the threads it changes (or of the whole
namespace) to "now + CLOCK_MARGIN_NS" before it writes and again when it is done
(:func:`changing`), and search verifies only the candidates whose version (the
writer's nanosecond clock, loom.clock.next_version) is not above the mark of their
thread or namespace, read *after* the candidate query: a change that finished before
that read raised the mark past every row it could have touched, and one that began
after it is linearised after the search. The margin covers clock skew between hosts.

Where the marks live: ClickHouse (table search_marks, migration 006; thread_id '' for
a whole namespace) is the truth, and a raise writes it first. Redis caches one hash
per namespace (field ``*`` for the namespace, ``t:<thread_id>`` per thread) and marks it
loaded with the run_id of the Redis process that loaded it: after a restart (which may
have lost the last writes) or an eviction, the namespace is loaded from ClickHouse
again. A thread with no mark has had no change since migration 006, which marked every
namespace holding rows of earlier builds: its mark is 0. Marks never go down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from clickhouse_connect.driver.client import Client
from redis.asyncio import Redis

from loom import redis_calls, redis_keys
from loom.read_index import feed
from loom.store.rows import column, frozen_table_row, named, table

CLOCK_MARGIN_NS = 2_000_000_000
WHOLE = ""  # thread_id of a namespace-wide mark
# The cache's generation is part of its keys: a migration that raises marks in ClickHouse
# (006, 007) cannot reach the caches of running processes, so a build that ships one
# starts a new generation and every namespace is loaded from ClickHouse again.

Run = Callable[..., Awaitable[Any]]  # runs blocking ClickHouse I/O off the loop (Services.run)
Pair = tuple[str, str]  # (namespace, thread_id); thread_id WHOLE = every thread

# KEYS: the namespaces' hashes. ARGV[1]: the mode; then, per key, a count and that many
# items: thread ids ("get"), or thread id and value pairs ("raise", "load").
#   get   -> per thread id, max(namespace mark, thread mark), or -1 for every thread of
#            a namespace this Redis process has not loaded
#   raise -> sets each field to the larger of its value and the given one
#   load  -> as raise, then marks the namespace loaded
# Values are microseconds: Redis's Lua counts in doubles, exact only to 2^53.
_SCRIPT = """
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local mode = ARGV[1]
local out = {}
local a = 2
local function field(thread) if thread == '' then return '*' end return 't:' .. thread end
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  a = a + 1
  if mode == 'get' then
    local loaded = redis.call('HGET', key, '@run') == run
    local wide = tonumber(redis.call('HGET', key, '*') or '0')
    for _ = 1, n do
      local mark = -1
      if loaded then mark = math.max(wide, tonumber(redis.call('HGET', key, field(ARGV[a])) or '0')) end
      out[#out + 1] = string.format('%d', mark)
      a = a + 1
    end
  else
    for _ = 1, n do
      local f = field(ARGV[a])
      local value = tonumber(ARGV[a + 1])
      if value > tonumber(redis.call('HGET', key, f) or '0') then
        redis.call('HSET', key, f, string.format('%d', value))
      end
      a = a + 2
    end
    if mode == 'load' then redis.call('HSET', key, '@run', run) end
  end
end
return out
"""


def key(namespace: str) -> str:
    return redis_keys.search_marks(namespace)


def _us(ns: int) -> str:
    return str(-(-ns // 1000))  # rounded up: a cached mark is never below the true one


def _by_namespace(pairs: Iterable[Pair]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ns, thread in pairs:
        out.setdefault(ns, []).append(thread)
    return out


# -- ClickHouse: the truth ----------------------------------------------------------


@frozen_table_row
class Mark:
    """A row of loom.search_marks (the newest mark of a thread wins)."""

    namespace: str = column("String")
    thread_id: str = column("String")
    mark: int = column("UInt64")


TABLE = table("search_marks", Mark)


def durable(ch: Client, namespaces: Sequence[str]) -> dict[str, dict[str, int]]:
    """Every mark of the namespaces, per thread id (WHOLE for the namespace's own)."""
    rows = ch.query(
        "SELECT namespace, thread_id, max(mark) AS newest FROM search_marks "
        "WHERE namespace IN {ns:Array(String)} GROUP BY namespace, thread_id",
        parameters={"ns": list(namespaces)},
    )
    out: dict[str, dict[str, int]] = {ns: {} for ns in namespaces}
    for r in named(rows):
        out[str(r["namespace"])][str(r["thread_id"])] = int(r["newest"])
    return out


def record(ch: Client, pairs: Iterable[Pair], mark: int) -> None:
    TABLE.insert(ch, [Mark(namespace=ns, thread_id=thread, mark=mark) for ns, thread in pairs])


# -- Redis: the cache ----------------------------------------------------------------


async def _eval(redis: Redis, mode: str, items: dict[str, list[str]]) -> list[int]:
    names = list(items)
    args: list[str] = [mode]
    for ns in names:
        step = 2 if mode != "get" else 1
        args += [str(len(items[ns]) // step), *items[ns]]
    got = await redis_calls.eval(redis, _SCRIPT, [key(ns) for ns in names], *args)
    return [int(v) for v in got]


async def _get(redis: Redis, wanted: dict[str, list[str]]) -> dict[Pair, int]:
    values = await _eval(redis, "get", wanted)
    pairs = [(ns, thread) for ns, threads in wanted.items() for thread in threads]
    return {p: v * 1000 if v >= 0 else -1 for p, v in zip(pairs, values, strict=True)}


async def read(redis: Redis, ch: Client, run: Run, pairs: Iterable[Pair]) -> dict[Pair, int]:
    """The mark of each (namespace, thread): vector rows of that thread whose version is
    not above it must be verified."""
    wanted = {ns: list(dict.fromkeys(threads)) for ns, threads in _by_namespace(pairs).items()}
    if not wanted:
        return {}
    marks = await _get(redis, wanted)
    unloaded = sorted({ns for (ns, _), mark in marks.items() if mark < 0})
    if unloaded:
        truth = await run(durable, ch, unloaded)
        await _eval(
            redis,
            "load",
            {ns: [x for thread, mark in truth[ns].items() for x in (thread, _us(mark))] for ns in unloaded},
        )
        marks.update(await _get(redis, {ns: wanted[ns] for ns in unloaded}))
    return marks


async def raise_marks(redis: Redis, ch: Client, run: Run, pairs: Iterable[Pair]) -> None:
    """Raise the marks of the (namespace, thread) pairs (thread WHOLE: the namespace) to
    now + the margin: ClickHouse first, so a Redis restart cannot lose a raise that a
    change relied on, then the cache (even where not loaded: a load merges by max)."""
    unique = list(dict.fromkeys(pairs))
    if not unique:
        return
    mark = time.time_ns() + CLOCK_MARGIN_NS
    await run(record, ch, unique, mark)
    await _eval(
        redis,
        "raise",
        {
            ns: [x for thread in threads for x in (thread, _us(mark))]
            for ns, threads in _by_namespace(unique).items()
        },
    )
    await feed.marks_raised(redis, unique, mark)  # the read index re-reads these threads


@contextlib.asynccontextmanager
async def changing(redis: Redis, ch: Client, run: Run, pairs: Sequence[Pair]) -> AsyncIterator[None]:
    """Around every write that rewrites or removes existing turns or embedding rows of
    the threads (or namespaces) named: their marks are raised before the block and
    again after it (also when it fails: part of its writes may have landed)."""
    await raise_marks(redis, ch, run, pairs)
    try:
        yield
    finally:
        await raise_marks(redis, ch, run, pairs)
