"""The namespaces' recording switches (loom.namespaces.conversation_logging_enabled),
cached in Redis for append's flush, which reads them for every batch.

ClickHouse stays the truth; the cache only saves the flush a ClickHouse read (~6 ms of
its ~19, measured 2026-12-01). It cannot answer with a switch older than the last
change that completed, because every writer of a namespace's row (loom.ops.platform.namespaces)
deletes the cached value *before* writing ClickHouse and sets the new one after, while a
reader that missed caches what it read with SET NX: whatever the interleaving, a reader's
older value either lands before the writer's SET (which overwrites it) or not at all.
A writer that dies between its write and its SET leaves at worst a reader's value read
before the write; the TTL bounds that.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from loom import redis_keys

TTL_S = 60


def key(namespace: str) -> str:
    return redis_keys.recording(namespace)


async def cached(redis: Redis, namespaces: Sequence[str]) -> dict[str, bool | None]:
    """The cached switch of each namespace; None where nothing is cached."""
    values = await redis.mget([key(ns) for ns in namespaces])
    return {ns: None if v is None else v == b"1" for ns, v in zip(namespaces, values, strict=True)}


async def remember(redis: Redis, switches: dict[str, bool]) -> None:
    """Cache switches a reader read from ClickHouse (never over a writer's value)."""
    pipe = redis.pipeline(transaction=False)
    for ns, on in switches.items():
        pipe.set(key(ns), "1" if on else "0", nx=True, ex=TTL_S)
    await pipe.execute()


async def forget(redis: Redis, namespace: str) -> None:
    """Before a writer changes the namespace's row in ClickHouse."""
    await redis.delete(key(namespace))


async def publish(redis: Redis, namespace: str, on: bool) -> None:
    """After a writer changed the namespace's row in ClickHouse."""
    await redis.set(key(namespace), "1" if on else "0", ex=TTL_S)
