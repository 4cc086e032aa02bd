"""The API process's cache of memory.search's one read (loom.store.memory_scan).

A user's facts change far less often than they are searched: an agent searches the same
user again and again while it talks to them. So the process keeps each scope's read
(facts, vectors, per-fact term counts: everything both legs rank by, for any query) and
answers the next search of the scope with no ClickHouse round trip, as long as the read
is current. Current means: no write of the user's facts became durable since the read.

The proof is one Redis read per search. Every write of a user's facts (memory.set, an
extraction's or crystallize's apply, memory.delete, the undo of a write an erasure
outlived, a user erasure's DELETEs) replaces the user's token (``memory_version``) with
a fresh random one *after* its rows are durable; a namespace erasure deletes the
namespace's token (``memory_version_of``) after its DELETEs. A search reads both tokens
*before* it reads the rows, and a cached read is used only while both tokens equal
those it was read under:

* a write durable before the search's token read changed the token before it, so a read
  cached earlier is not used, and a read made now sees the rows;
* a write that changes the token after the search's token read makes the read taken
  then (whatever it saw) carry the older token: the next search does not use it.

A missing token (expired, evicted, deleted, a Redis restart) is created afresh by the
reader (a random token never equals an older one), which retires every read cached
under the old one. A writer that dies between its insert and the token's change would
leave a read cached just before its insert in use: so a cached read also retires after
MAX_AGE_S.

Time moves the current facts without a write (a fact's validity starts or ends): the
read holds every fact not forgotten, not superseded and not closed when it was read,
and each search keeps those valid at its own time (memory_scan.select). `as_of` reads
bypass the cache (rare, and the facts valid then include superseded ones). The cache
is bounded by LOOM_MEMORY_SEARCH_CACHE_MB (least recently used scopes leave first);
0 turns it off.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from loom import redis_calls, redis_keys
from loom.clock import utcnow
from loom.services import Services
from loom.store import memory_scan
from loom.store.memories import Scope
from loom.store.memory_scan import ScopeRows, ScopeScan

TOKEN_TTL_S = 86_400
MAX_AGE_S = 120.0
_KEY = "memory.scan_cache"

# Both tokens in one round trip; a missing one is created (never read back as absent).
_READ_TOKENS = """
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v then
    v = ARGV[1] .. ':' .. i
    redis.call('SET', k, v, 'EX', ARGV[2])
  end
  out[i] = v
end
return out
"""


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


R = TypeVar("R", bound=Sized)


@dataclass
class _Entry(Generic[R]):
    label: tuple[str, ...]
    rows: R
    at: float  # time.monotonic() when it was stored
    nbytes: int


class ScanCache(Generic[R]):
    """Scopes' reads by scope, least recently used first out, within `max_bytes` (the
    one reads here; the large scopes' indexes in loom.ops.memory.large_scope)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[Scope, _Entry[R]] = OrderedDict()
        self.nbytes = 0

    def get(self, scope: Scope, label: tuple[str, ...]) -> R | None:
        e = self.entries.get(scope)
        if e is None:
            return None
        if e.label != label or time.monotonic() - e.at > MAX_AGE_S:
            self._drop(scope)
            return None
        self.entries.move_to_end(scope)
        return e.rows

    def put(self, scope: Scope, label: tuple[str, ...], rows: R) -> bool:
        """Keep `rows` (False: larger than the whole budget, not kept)."""
        size = rows.nbytes
        if size > self.max_bytes:
            return False
        self._drop(scope)
        self.entries[scope] = _Entry(label, rows, time.monotonic(), size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
        return True

    def _drop(self, scope: Scope) -> None:
        e = self.entries.pop(scope, None)
        if e is not None:
            self.nbytes -= e.nbytes


def cache_of(svc: Services) -> ScanCache[ScopeRows] | None:
    """This process's cache (None when LOOM_MEMORY_SEARCH_CACHE_MB is 0); resized when
    the setting changes."""
    return sized_cache(svc, _KEY, svc.settings.memory_search_cache_mb)


def sized_cache(svc: Services, key: str, mb: int) -> ScanCache[R] | None:
    """The process's cache kept under `key` with a budget of `mb` MiB (None when 0)."""
    max_bytes = mb * 1024 * 1024
    if max_bytes <= 0:
        svc.extras.pop(key, None)
        return None
    cache = svc.extras.get(key)
    if not isinstance(cache, ScanCache):
        cache = svc.extras[key] = ScanCache(max_bytes)
    elif cache.max_bytes != max_bytes:
        cache.max_bytes = max_bytes
        while cache.nbytes > max_bytes and cache.entries:
            cache._drop(next(iter(cache.entries)))
    return cache


async def label(svc: Services, scope: Scope) -> tuple[str, ...]:
    """The tokens a read of `scope` made now is current under (created when missing)."""
    keys = [
        redis_keys.memory_version_of(scope.namespace),
        redis_keys.memory_version(scope.namespace, scope.user_id),
    ]
    got = await redis_calls.eval(svc.redis, _READ_TOKENS, keys, uuid.uuid4().hex, str(TOKEN_TTL_S))
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in got)


async def changed(svc: Services, namespace: str, user_id: str) -> None:
    """Call once a write of the user's facts is durable: every cached read of the user
    (in every process) stops being current."""
    await svc.redis.set(redis_keys.memory_version(namespace, user_id), uuid.uuid4().hex, ex=TOKEN_TTL_S)


async def scan(
    svc: Services, scope: Scope, query: str, *, cap: int, as_of: datetime | None = None
) -> ScopeScan | None:
    """memory_scan.scan, from this process's cache when its read of the scope is current
    (no ClickHouse round trip then). None: the scope holds more than `cap` facts."""
    cache = cache_of(svc) if as_of is None else None
    if cache is None:
        return await svc.run(memory_scan.scan, svc.ch, scope, query, cap=cap, as_of=as_of)
    current = await label(svc, scope)  # before the read: see the module's docstring
    rows = cache.get(scope, current)
    if rows is not None and len(rows.facts) > cap:
        return None  # as the read would answer under this cap
    if rows is None:
        rows = await svc.run(memory_scan.read, svc.ch, scope, cap=cap, now=utcnow())
        if rows is None:
            return None
        cache.put(scope, current, rows)
    return memory_scan.select(rows, query, at=utcnow())
