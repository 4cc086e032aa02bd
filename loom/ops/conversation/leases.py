"""Thread leases for a batch: the same per-(namespace, thread_id) lease as
:func:`loom.leases.thread_lease` (same key, token, TTL and compare-and-set scripts),
taken for many threads with one Redis round trip.

A batch write of embedding rows touches many threads. Taking their leases one by one
would cost a round trip each; here they are all asked for in one pipeline, the work
runs for the threads whose lease was won, those leases are released, and the threads
still held by someone else are tried again after a short backoff. Nothing waits while
holding a lease, so two batch writers cannot deadlock on each other's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from redis.asyncio import Redis

from loom.leases import _RELEASE, _RENEW, Lease, LeaseTimeout, thread_lease_key

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


__all__ = ["LeaseTimeout", "Pair", "under_thread_leases"]
