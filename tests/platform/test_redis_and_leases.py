from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from loom.embedded.redis_server import find_running_redis, start_redis
from loom.leases import Lease, LeaseTimeout, hold


def test_embedded_redis_persists_and_stops(tmp_path_factory):
    import redis

    d = tmp_path_factory.mktemp("r", numbered=True)
    server = start_redis(d)
    try:
        client = redis.Redis.from_url(server.url)
        config: dict[str, str] = client.config_get("*")  # type: ignore[assignment]
        assert config["appendonly"] == "yes"
        assert config["hash-max-ziplist-entries"] == "1024"  # loom.store.landed's hashes stay compact
        client.set("k", "v")
        assert find_running_redis(d) == server.url
    finally:
        server.stop()
    assert not server.alive()
    again = start_redis(d)
    try:
        assert redis.Redis.from_url(again.url).get("k") == b"v"  # AOF brought it back
    finally:
        again.stop()


async def test_lease_is_exclusive_and_renewable(backend_urls):
    r = Redis.from_url(backend_urls[1])
    a, b = Lease(r, "loom:test:lease", 200), Lease(r, "loom:test:lease", 200)
    assert await a.try_acquire()
    assert not await b.try_acquire()
    await a.renew()
    with pytest.raises(LeaseTimeout):
        await b.acquire(wait_s=0.05)
    await b.release()  # not held: must not free a's lease
    assert await r.get("loom:test:lease") == a.token.encode()
    await a.release()
    assert await b.try_acquire()
    await b.release()
    await r.aclose()


async def test_hold_serialises_critical_sections(backend_urls):
    r = Redis.from_url(backend_urls[1])
    inside = 0
    peak = 0

    async def worker() -> None:
        nonlocal inside, peak
        async with hold(r, "loom:test:serial", ttl_ms=300):
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(worker() for _ in range(20)))
    assert peak == 1
    await r.aclose()


async def test_hold_renews_past_ttl(backend_urls):
    r = Redis.from_url(backend_urls[1])
    async with hold(r, "loom:test:long", ttl_ms=150) as lease:
        await asyncio.sleep(0.5)  # > 3 TTLs: still ours thanks to renewal
        assert await r.get("loom:test:long") == lease.token.encode()
    assert await r.get("loom:test:long") is None
    await r.aclose()
