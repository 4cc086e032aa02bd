"""Which turns may have landed, noted in Redis, so that an append flush reads ClickHouse
only for the turns that may be duplicates.

Every writer of transcript rows notes a turn here *before* it inserts the row (append's
flush in :func:`claim_and_note`, a save's new row in :func:`note`). A note is a field
in a small Redis hash (``HSETNX``), and ``HSETNX`` answers 1 only for a turn never
noted. In a namespace whose notes are complete ("ready": every turn that landed before
the notes began was noted from :func:`key_page`, then :func:`mark_ready`), such a turn has certainly not landed, and
the flush skips ClickHouse's existence read for it; measured, that read was half of a
tool-append flush's engine time (11 of 23 ms, bench/results/archive/2026-12-01-append.txt).

Anything else is a "maybe" and is read from ClickHouse as before: a turn noted earlier,
a namespace not ready, a note whose insert failed, a removed row, two keys sharing a
digest. A note can therefore be stale or wrong in the safe direction only; notes are
never removed.

Redis may lose the last second of writes when it crashes (AOF, everysec). The ready
mark holds the ``run_id`` of the Redis process that completed the notes, and a restart
changes it, so after a restart every namespace is read from ClickHouse again until
its notes are rebuilt (the first flush in the namespace starts that:
loom.ops.conversation.writing.appending).

Layout: 4,096 hashes per namespace (``loom:landed:{ns}:{bucket}``), 6-byte fields from a
BLAKE2b digest of the key, two per turn (this agent's copy, and any agent's: the latter
tells which turns another agent logged too, whose vector may be reused). Small hashes
stay in Redis's compact encoding (``hash-max-ziplist-entries``, raised to 1,024 for the
embedded Redis): about 20 bytes per turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client
from redis.asyncio import Redis

from loom import redis_calls, redis_keys
from loom.store.keys import TurnKey
from loom.store.rows import named

BUCKETS = 4096
REBUILD_PAGE = 20_000

# KEYS: the ready marks of the batch's namespaces (n of them), then per turn its claim
# key and the buckets of its two notes. ARGV: n, the claim's value (the flush id), its
# TTL, the prefix of the flushes' live marks, their TTL in ms, then per turn the two
# note fields and the (1-based) index of its namespace's ready mark.
# Marks the writer live, then returns per turn a bit set: 1 claimed (or held by this
# same writer already), 2 never noted for this agent, 4 never noted for any agent, 8 its
# namespace is ready, 16 not claimed because a live save holds the claim, 32 claimed by
# taking it over from a writer (a flush or a save) that is no longer live (it died, or
# ended without releasing it: its row may or may not have landed, so the taker reads
# ClickHouse). Not claimed and no 16: a live flush holds it.
_CLAIM_AND_NOTE = """
local n = tonumber(ARGV[1])
local live = ARGV[4]
redis.call('SET', live .. ARGV[2], '1', 'PX', ARGV[5])
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local ready = {}
for i = 1, n do ready[i] = (redis.call('GET', KEYS[i]) == run) end
local out = {}
local t = 0
for k = n + 1, #KEYS, 3 do
  local a = 6 + t * 3
  t = t + 1
  local bits = 0
  if redis.call('SET', KEYS[k], ARGV[2], 'NX', 'EX', ARGV[3]) then bits = bits + 1
  else
    local holder = redis.call('GET', KEYS[k]) or ''
    if holder == ARGV[2] then bits = bits + 1
    elseif redis.call('EXISTS', live .. holder) == 1 then
      if string.sub(holder, 1, 5) == 'save:' then bits = bits + 16 end
    else
      redis.call('SET', KEYS[k], ARGV[2], 'EX', ARGV[3])
      bits = bits + 1 + 32
    end
  end
  bits = bits + 2 * redis.call('HSETNX', KEYS[k + 1], ARGV[a], '')
  bits = bits + 4 * redis.call('HSETNX', KEYS[k + 2], ARGV[a + 1], '')
  if ready[tonumber(ARGV[a + 2])] then bits = bits + 8 end
  out[t] = bits
end
return out
"""

# The value a save's claim on a turn starts with (loom.ops.conversation.saved.saving): the
# script above tells an append that a save, not another append, holds the turn. A save
# claims through the same script, live under the same marks as a flush (its claim
# value is its writer id): a save that died between its claim and its insert is taken
# over like a dead flush.
SAVE_CLAIM_PREFIX = "save:"

_RUN_ID = "return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')"

# Set the ready mark only if Redis has not restarted since the rebuild began.
_MARK_READY = """
if string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Noted:
    """What claim_and_note() learnt of one turn."""

    claimed: bool  # this writer holds the turn's claim (no concurrent writer does)
    first_note: bool  # never noted for this agent before
    first_any: bool  # never noted for any agent before
    ready: bool  # its namespace's notes are complete
    held_by_save: bool = False  # not claimed: a live save holds it (its row may be saved-only)
    taken_over: bool = False  # claimed from a writer no longer live (its row may have landed)

    @property
    def certainly_new(self) -> bool:
        """Never landed for this agent: no ClickHouse read needed."""
        return self.first_note and self.ready and not self.taken_over

    @property
    def contested(self) -> bool:
        """Another live writer (an append's flush or a save) holds the claim: its row
        may land, or not."""
        return not self.claimed


def _digest(kind: str, parts: Iterable[str]) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    h.update(kind.encode())
    for p in parts:
        data = p.encode()
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return h.digest()


def _slot(namespace: str, digest: bytes) -> tuple[str, bytes]:
    bucket = int.from_bytes(digest[:2], "big") % BUCKETS
    return redis_keys.landed_bucket(namespace, bucket), digest[2:]


def _this_agent(key: TurnKey) -> tuple[str, bytes]:
    return _slot(key[0], _digest("a", key))


def _any_agent(key: TurnKey) -> tuple[str, bytes]:
    return _slot(key[0], _digest("x", (key[0], key[2], key[3])))


def ready_key(namespace: str) -> str:
    return redis_keys.landed_ready(namespace)


async def claim_and_note(
    redis: Redis,
    keys: Sequence[TurnKey],
    claim_keys: Sequence[str],
    claim_value: str,
    claim_ttl_s: int,
    live_ms: int,
) -> list[Noted]:
    """In one atomic round trip: mark the writer `claim_value` (a flush id, or a save's
    claim) live for `live_ms` (its owner renews the mark while it runs:
    :func:`keep_live`), then claim each turn (SET NX with a TTL, or a take-over of a
    claim whose writer is no longer live) and note it."""
    if not keys:
        return []
    namespaces = list(dict.fromkeys(k[0] for k in keys))
    index = {ns: i + 1 for i, ns in enumerate(namespaces)}
    script_keys: list[str] = [ready_key(ns) for ns in namespaces]
    args: list[str | bytes | int] = [
        len(namespaces),
        claim_value,
        claim_ttl_s,
        redis_keys.APPEND_FLUSH,
        live_ms,
    ]
    for key, claim in zip(keys, claim_keys, strict=True):
        (a_bucket, a_field), (x_bucket, x_field) = _this_agent(key), _any_agent(key)
        script_keys += [claim, a_bucket, x_bucket]
        args += [a_field, x_field, index[key[0]]]
    bits = await redis_calls.eval(redis, _CLAIM_AND_NOTE, script_keys, *args)
    return [
        Noted(bool(b & 1), bool(b & 2), bool(b & 4), bool(b & 8), bool(b & 16), bool(b & 32)) for b in bits
    ]


# KEYS: claim keys. ARGV: the live marks' prefix. Per claim, its holder's flush id when
# that flush is live and itself waiting on a turn another flush holds, else ''.
_WAITING_HOLDERS = """
local out = {}
for i = 1, #KEYS do
  local holder = redis.call('GET', KEYS[i]) or ''
  if holder ~= '' and redis.call('GET', ARGV[1] .. holder) == 'waiting' then out[i] = holder else out[i] = '' end
end
return out
"""


async def mark_waiting(redis: Redis, flush_id: str) -> None:
    """Mark a live flush as waiting on turns other flushes hold (its mark keeps its TTL)."""
    await redis.set(redis_keys.append_flush(flush_id), "waiting", xx=True, keepttl=True)


async def waiting_holders(redis: Redis, claim_keys: Sequence[str]) -> list[str]:
    """Per claim: the id of its flush if that flush is live and waiting too, else ''."""
    got = await redis_calls.eval(redis, _WAITING_HOLDERS, claim_keys, redis_keys.APPEND_FLUSH)
    return [g.decode() if isinstance(g, bytes) else str(g) for g in got]


async def keep_live(redis: Redis, flush_ids: Iterable[str], live_ms: int) -> None:
    """Extend the live marks of flushes still running (PEXPIRE: an ended flush's mark,
    already gone, is not made again)."""
    pipe = redis.pipeline(transaction=False)
    for flush_id in flush_ids:
        pipe.pexpire(redis_keys.append_flush(flush_id), live_ms)
    await pipe.execute()


async def note(redis: Redis, keys: Sequence[TurnKey]) -> None:
    """Note turns about to be inserted by a writer other than append's flush."""
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        for bucket, fld in (_this_agent(key), _any_agent(key)):
            pipe.hsetnx(bucket, fld, "")  # type: ignore[arg-type]  # redis-py wants str; bytes keys are what the script uses
    await pipe.execute()


def key_page(ch: Client, namespace: str, after: TurnKey | None, size: int = REBUILD_PAGE) -> list[TurnKey]:
    """The namespace's turns as ClickHouse holds them (every version: a turn tombstoned
    or removed since has landed all the same), in key order, after `after`."""
    cursor = ("", "", "") if after is None else after[1:]
    rows = ch.query(
        "SELECT toString(agent) AS ag, thread_id, msg_id FROM conversations WHERE namespace = {ns:String} "
        "AND (agent, thread_id, msg_id) > ({ag:String}, {th:String}, {id:String}) "
        "ORDER BY agent, thread_id, msg_id LIMIT {n:UInt32}",
        parameters={"ns": namespace, "ag": cursor[0], "th": cursor[1], "id": cursor[2], "n": size},
    )
    return [TurnKey(namespace, r["ag"], r["thread_id"], r["msg_id"]) for r in named(rows)]


async def run_id(redis: Redis) -> str:
    """The running Redis process's id (a restart changes it)."""
    got = await redis_calls.eval(redis, _RUN_ID, [])
    return got.decode() if isinstance(got, bytes) else str(got)


async def mark_ready(redis: Redis, namespace: str, since_run_id: str) -> bool:
    """Mark the namespace's notes complete, unless Redis restarted since `since_run_id`
    was read (notes written before the restart may be lost). True: marked."""
    return bool(await redis_calls.eval(redis, _MARK_READY, [ready_key(namespace)], since_run_id))
