"""A namespace's whole row (loom.namespaces), cached in Redis for the ops that read it on
every request (conversation.compact's model-call switch: a burst of 32 compactions read
it 32 times at once, on the engine the appends were waiting for).

The same protocol as the recording switch (loom.store.recording_cache): every writer of
the row deletes the cached value before writing ClickHouse and sets the new one after;
a reader that missed caches what it read with SET NX, so a reader's older value lands
before the writer's SET (which overwrites it) or not at all; the TTL bounds what a
writer that died between its write and its SET leaves.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from redis.asyncio import Redis

from loom import redis_keys
from loom.store.namespaces import NamespaceConfig

TTL_S = 60


async def cached(redis: Redis, namespace: str) -> NamespaceConfig | None:
    raw = await redis.get(redis_keys.namespace_config(namespace))
    return None if raw is None else NamespaceConfig(**json.loads(raw))


async def remember(redis: Redis, config: NamespaceConfig) -> None:
    """Cache a row a reader read from ClickHouse (never over a writer's value)."""
    await redis.set(redis_keys.namespace_config(config.namespace), _dump(config), nx=True, ex=TTL_S)


async def forget(redis: Redis, namespace: str) -> None:
    """Before a writer changes the namespace's row in ClickHouse."""
    await redis.delete(redis_keys.namespace_config(namespace))


async def publish(redis: Redis, config: NamespaceConfig) -> None:
    """After a writer changed the namespace's row in ClickHouse."""
    await redis.set(redis_keys.namespace_config(config.namespace), _dump(config), ex=TTL_S)


def _dump(config: NamespaceConfig) -> str:
    return json.dumps(asdict(config), separators=(",", ":"))
