"""Redis-held leases: SET NX PX with a random token, renewed and
released by compare-and-set scripts so a holder never touches a lease it lost.

The thread lease (one per (namespace, thread_id)) is held by save, unsave, append's
embedding write, compaction's retirement and thread deletion. Provider calls happen
before it is taken, so it is held for milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from loom import redis_calls, redis_keys

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class LeaseTimeout(TimeoutError):
    pass


class LeaseLost(RuntimeError):
    pass


class Lease:
    def __init__(self, redis: Redis, key: str, ttl_ms: int = 10_000):
        self.redis = redis
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(16)
        self.held = False

    async def try_acquire(self) -> bool:
        self.held = bool(await self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    async def acquire(self, wait_s: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        delay = 0.001
        while not await self.try_acquire():
            if loop.time() > deadline:
                raise LeaseTimeout(f"lease {self.key} still held by another writer after {wait_s}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    async def renew(self) -> None:
        if not await redis_calls.eval(self.redis, _RENEW, [self.key], self.token, str(self.ttl_ms)):
            self.held = False
            raise LeaseLost(f"lease {self.key} expired before it was renewed")

    async def release(self) -> None:
        if self.held:
            await redis_calls.eval(self.redis, _RELEASE, [self.key], self.token)
            self.held = False


def thread_lease_key(namespace: str, thread_id: str) -> str:
    return redis_keys.thread_lease(namespace, thread_id)


@contextlib.asynccontextmanager
async def hold(redis: Redis, key: str, *, ttl_ms: int = 10_000, wait_s: float = 10.0) -> AsyncIterator[Lease]:
    """Hold a lease for the block, renewing it at a third of its TTL."""
    lease = Lease(redis, key, ttl_ms)
    await lease.acquire(wait_s)

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(ttl_ms / 3000)
            await lease.renew()

    renewer = asyncio.create_task(keep_alive())
    try:
        yield lease
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await renewer
        await lease.release()


def thread_lease(
    redis: Redis, namespace: str, thread_id: str, *, ttl_ms: int = 10_000, wait_s: float = 10.0
) -> contextlib.AbstractAsyncContextManager[Lease]:
    return hold(redis, thread_lease_key(namespace, thread_id), ttl_ms=ttl_ms, wait_s=wait_s)
