"""The live replicas of a deploy: every API and worker process registers its build, the
schema it writes and the capabilities it implements in Redis, with a heartbeat.

During a rolling deploy processes of two builds share one store. A rule that holds only
if every process implements it (a saved turn survives compaction) is in force only while
every live replica declares its capability: :func:`shared` is what all of them share.
A replica that stops cleanly removes its entry; one that dies is dropped once its
heartbeat is older than LIVE_WINDOW_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from redis import Redis as SyncRedis
from redis.asyncio import Redis

from clickhouse_schema import runner
from loom import logging as loom_logging
from loom import redis_calls
from loom.redis_keys import REPLICAS

if TYPE_CHECKING:
    from loom.services import Services

log = loom_logging.get("loom.replicas")

BUILD = "loom 0.1.0"
# What this build implements that a rolling deploy must not lose:
# - saved_state_preserved_in_compaction: compaction and deletes keep a saved turn verbatim.
SAVED_STATE = "saved_state_preserved_in_compaction"
CAPABILITIES: tuple[str, ...] = (SAVED_STATE,)

HEARTBEAT_S = 5.0
LIVE_WINDOW_S = 15.0  # three missed heartbeats: the replica is gone
SHARED_CACHE_S = 1.0  # how long a process reuses what it read (saves ask on every call)


@dataclass(frozen=True)
class Replica:
    replica_id: str
    kind: str  # "api" | "worker" | another process that writes
    build: str
    schema: int  # the newest migration this build knows (and writes rows for)
    capabilities: tuple[str, ...]
    host: str = ""
    pid: int = 0
    started_at: float = 0.0
    seen_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Replica | None:
        try:
            data: dict[str, Any] = json.loads(raw)
            data["capabilities"] = tuple(data.get("capabilities") or ())
            return cls(**data)
        except (ValueError, TypeError):
            return None  # an entry this build cannot read is not one it can trust


def this_process(kind: str, schema: int, capabilities: Iterable[str] = CAPABILITIES) -> Replica:
    now = time.time()
    return Replica(
        replica_id=f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        kind=kind,
        build=BUILD,
        schema=schema,
        capabilities=tuple(capabilities),
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=now,
        seen_at=now,
    )


def _live(entries: dict[Any, Any], now: float) -> tuple[list[Replica], list[Any]]:
    live: list[Replica] = []
    gone: list[Any] = []
    for key, raw in entries.items():
        replica = Replica.from_json(raw)
        if replica is None or now - replica.seen_at > LIVE_WINDOW_S:
            gone.append(key)
        else:
            live.append(replica)
    return sorted(live, key=lambda r: r.replica_id), gone


async def live(redis: Redis) -> list[Replica]:
    """The replicas whose heartbeat is recent; entries of gone ones are removed."""
    # redis-py's hash commands are typed for its sync and async clients at once.
    entries = await redis_calls.hgetall(redis, REPLICAS)
    replicas, gone = _live(entries, time.time())
    if gone:
        await redis_calls.hdel(redis, REPLICAS, *gone)
    return replicas


def live_sync(redis: SyncRedis) -> list[Replica]:
    """:func:`live` for a synchronous caller (the migration runner)."""
    entries = cast(dict[Any, Any], redis.hgetall(REPLICAS))  # the sync client answers at once
    replicas, _ = _live(entries, time.time())
    return replicas


def shared_by(replicas: list[Replica]) -> set[str]:
    """The capabilities every one of `replicas` declares; this build's own when none
    is registered (a process that registers nothing, such as a test, lacks nothing)."""
    if not replicas:
        return set(CAPABILITIES)
    found = set(replicas[0].capabilities)
    for replica in replicas[1:]:
        found &= set(replica.capabilities)
    return found


@dataclass
class _SharedCache:
    at: float = -1e9
    value: set[str] = field(default_factory=set)


_cache = _SharedCache()


async def shared(redis: Redis) -> set[str]:
    """What every live replica shares, read at most once a second per process."""
    now = time.monotonic()
    if now - _cache.at > SHARED_CACHE_S:
        _cache.value, _cache.at = shared_by(await live(redis)), now
    return set(_cache.value)


def forget_cache() -> None:
    _cache.at = -1e9


async def _beat(redis: Redis, replica: Replica) -> None:
    while True:
        with contextlib.suppress(Exception):  # a missed beat is retried; a dead Redis is reported elsewhere
            fresh = Replica(**{**asdict(replica), "seen_at": time.time()})
            await redis_calls.hset(redis, REPLICAS, replica.replica_id, fresh.to_json())
        await asyncio.sleep(HEARTBEAT_S)


@contextlib.asynccontextmanager
async def registered(redis: Redis, replica: Replica) -> AsyncIterator[Replica]:
    """Registered with a heartbeat for the block's life, removed at its end."""
    await redis_calls.hset(redis, REPLICAS, replica.replica_id, replica.to_json())
    beating = asyncio.create_task(_beat(redis, replica))
    log.info("replica registered", replica=replica.replica_id, schema=replica.schema)
    try:
        yield replica
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        with contextlib.suppress(Exception):
            await redis_calls.hdel(redis, REPLICAS, replica.replica_id)


@contextlib.asynccontextmanager
async def serving(svc: Services, kind: str) -> AsyncIterator[Replica]:
    """A serving process's life: it refuses a database migrated by a newer build
    (SchemaTooNew), then is registered as a live replica until it stops."""
    await svc.run(runner.check_not_newer, svc.ch)
    async with registered(svc.redis, this_process(kind, runner.newest_known())) as replica:
        yield replica
