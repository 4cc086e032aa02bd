"""Redis-held leases: SET NX PX with a random token, renewed and
released by compare-and-set scripts so a holder never touches a lease it lost.

The thread lease (one per (namespace, thread_id)) is held by save, unsave, append's
embedding write, compaction's retirement and thread deletion. Provider calls happen
before it is taken, so it is held for milliseconds. Every lease Loom takes is taken
here: one at a time (:func:`hold`, :func:`thread_lease`), a batch of thread leases in
one round trip (:func:`under_thread_leases`), or a lease a long pass keeps renewed
(:func:`keep_renewed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

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
    async with kept_renewed(lease, f"renew {key}", release_errors=True):
        yield lease


@contextlib.asynccontextmanager
async def kept_renewed(
    lease: Lease, name: str, *, release_errors: bool = False
) -> AsyncIterator[asyncio.Task[None]]:
    """Run the body with `lease` (already acquired) renewed by a keeper task, which it
    gets to check (done: the lease was lost); the keeper is stopped and the lease
    released however the body ends. A background pass (the embedding recovery pass, an
    import's embedding) passes ``release_errors=False``: a failed release there only lets
    the lease expire, and must not fail a pass whose work is written."""
    keeper = asyncio.get_running_loop().create_task(keep_renewed(lease), name=name)
    try:
        yield keeper
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await keeper
        if release_errors:
            await lease.release()
        else:
            with contextlib.suppress(Exception):
                await lease.release()


def thread_lease(
    redis: Redis, namespace: str, thread_id: str, *, ttl_ms: int = 10_000, wait_s: float = 10.0
) -> contextlib.AbstractAsyncContextManager[Lease]:
    return hold(redis, thread_lease_key(namespace, thread_id), ttl_ms=ttl_ms, wait_s=wait_s)


async def keep_renewed(lease: Lease) -> None:
    """Renew the lease at a third of its TTL until cancelled; LeaseLost ends it (the
    holder stops at its next step)."""
    while True:
        await asyncio.sleep(lease.ttl_ms / 3000)
        await lease.renew()


# -- a batch of thread leases in one round trip --------------------------------------
# Thread leases for a batch: the same per-(namespace, thread_id) lease as
# :func:`loom.leases.thread_lease` (same key, token, TTL and compare-and-set scripts),
# taken for many threads with one Redis round trip.
#
# A batch write of embedding rows touches many threads. Taking their leases one by one
# would cost a round trip each; here they are all asked for in one pipeline, the work
# runs for the threads whose lease was won, those leases are released, and the threads
# still held by someone else are tried again after a short backoff. Nothing waits while
# holding a lease, so two batch writers cannot deadlock on each other's threads.

Pair = tuple[str, str]  # (namespace, thread_id)


async def under_thread_leases(
    redis: Redis,
    pairs: Iterable[Pair],
    work: Callable[[set[Pair]], Awaitable[None]],
    *,
    ttl_ms: int = 10_000,
    wait_s: float = 10.0,
) -> None:
    """Run `work(held)` for every pair, each call holding the thread leases of `held`.

    `work` may be called more than once with disjoint sets that together cover `pairs`.
    Raises LeaseTimeout when some thread's lease stays taken for `wait_s`.
    """
    remaining = set(pairs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = 0.001
    while remaining:
        order = sorted(remaining)
        leases = {p: Lease(redis, thread_lease_key(*p), ttl_ms) for p in order}
        pipe = redis.pipeline(transaction=False)
        for p in order:
            pipe.set(leases[p].key, leases[p].token, nx=True, px=ttl_ms)
        won = await pipe.execute()
        held = {p for p, ok in zip(order, won, strict=True) if ok}
        for p in held:
            leases[p].held = True
        if held:
            mine = [leases[p] for p in held]
            renewer = loop.create_task(_keep_alive(redis, mine, ttl_ms))
            try:
                await work(held)
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await renewer
                await _release(redis, mine)
        remaining -= held
        if remaining:
            if loop.time() > deadline:
                raise LeaseTimeout(
                    f"{len(remaining)} thread lease(s) still held by another writer after {wait_s}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)


async def _keep_alive(redis: Redis, leases: list[Lease], ttl_ms: int) -> None:
    while True:
        await asyncio.sleep(ttl_ms / 3000)
        pipe = redis.pipeline(transaction=False)
        for lease in leases:
            pipe.eval(_RENEW, 1, lease.key, lease.token, str(ttl_ms))
        await pipe.execute()


async def _release(redis: Redis, leases: list[Lease]) -> None:
    pipe = redis.pipeline(transaction=False)
    for lease in leases:
        pipe.eval(_RELEASE, 1, lease.key, lease.token)
        lease.held = False
    await pipe.execute()
