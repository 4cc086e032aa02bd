"""redis-py's asyncio client, annotated as it behaves.

redis.asyncio.Redis shares the synchronous client's annotations (`Awaitable[T] | T`,
`timeout: int`), which mypy cannot await and which refuse a float timeout; each call
Loom makes on it goes through here, where its answer type is said once."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, cast

from redis.asyncio import Redis

Arg = str | bytes | int | float


async def eval(redis: Redis, script: str, keys: Sequence[str], *args: Arg) -> Any:
    """Run a Lua script over `keys` with `args`: its reply as the server sent it."""
    client: Any = redis  # the annotation takes only strings after the keys
    return await client.eval(script, len(keys), *keys, *args)


async def blpop(redis: Redis, keys: Sequence[str], timeout: float) -> tuple[bytes, bytes] | None:
    """Pop the first item of the first non-empty list, waiting up to `timeout` seconds."""
    client: Any = redis  # the server takes a float timeout; the annotation says int
    got = await client.blpop(list(keys), timeout=timeout)
    return cast(tuple[bytes, bytes] | None, got)


async def hgetall(redis: Redis, key: str) -> dict[bytes, bytes]:
    return await cast(Awaitable[dict[bytes, bytes]], redis.hgetall(key))


async def hset(redis: Redis, key: str, field: str, value: str) -> int:
    return await cast(Awaitable[int], redis.hset(key, field, value))


async def hdel(redis: Redis, key: str, *fields: str) -> int:
    return await cast(Awaitable[int], redis.hdel(key, *fields))
