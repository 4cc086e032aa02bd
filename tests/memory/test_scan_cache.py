"""The API process's cache of memory.search's one read (loom.ops.memory.scan_cache):
a search answered from it is never staler than one Redis read proves. Writes go through
one Services (the API), searches through another with a cache of its own (another
process, as far as the cache can tell)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from loom import redis_keys
from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.models.memory import MemorySearchRequest
from loom.ops.erasure import requesting
from loom.ops.memory import facts, scan_cache
from loom.store import memory_scan
from loom.store.memories import Scope
from tests.memory.conftest import record_arg


@pytest.fixture
def other(services: Any) -> Any:
    """Another Services over the same backends, with a cache (and extras) of its own."""
    return dataclasses.replace(services, extras={})


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Scope]:
    """Every scope the one read went to ClickHouse for."""
    return record_arg(monkeypatch, memory_scan, "read", 1)


async def _texts(svc: Any, ns: str, user: str, query: str, **kw: Any) -> list[str]:
    who = Principal("t", (ns,), Role.viewer)
    found = await facts.search(
        svc, who, MemorySearchRequest(namespace=ns, user_id=user, query=query, limit=20, **kw)
    )
    return [h.fact.text for h in found.hits]


async def _set(call: Any, token: str, ns: str, user: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = await call("memory.set", token, namespace=ns, user_id=user, facts=list(items))
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


async def test_a_write_elsewhere_is_seen_by_the_next_search(call, ns, mint, other, reads):
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", {"text": "Drinks coffee in Kyoto"})
    assert await _texts(other, ns, "u1", "coffee") == ["Drinks coffee in Kyoto"]
    assert await _texts(other, ns, "u1", "kyoto coffee") == ["Drinks coffee in Kyoto"]
    assert len(reads) == 1  # the second search read no row
    await _set(call, w, ns, "u1", {"text": "Buys coffee beans weekly", "key": "beans"})
    assert sorted(await _texts(other, ns, "u1", "coffee")) == [
        "Buys coffee beans weekly",
        "Drinks coffee in Kyoto",
    ]
    assert len(reads) == 2
    # a supersession (same key, another text): the old fact leaves the current ones
    await _set(call, w, ns, "u1", {"text": "Buys coffee beans monthly", "key": "beans"})
    assert sorted(await _texts(other, ns, "u1", "coffee")) == [
        "Buys coffee beans monthly",
        "Drinks coffee in Kyoto",
    ]
    # as_of reads the facts valid then, superseded ones included, and bypasses the cache
    before = len(reads)
    past = await _texts(other, ns, "u1", "coffee beans", as_of=utcnow() - timedelta(days=3650))
    assert past == [] and len(reads) == before + 1  # nothing held then, read from the server
    assert sorted(await _texts(other, ns, "u1", "beans")) == ["Buys coffee beans monthly"]
    assert len(reads) == before + 1  # the cached current read stands
    # a delete (tombstones) is seen at once
    mid = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    kyoto = next(f["memory_id"] for f in mid if "Kyoto" in f["text"])
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[kyoto])
    assert r.status_code == 200, r.text
    assert await _texts(other, ns, "u1", "coffee") == ["Buys coffee beans monthly"]
    # another user's write does not retire u1's read
    n = len(reads)
    await _set(call, w, ns, "u2", {"text": "Drinks tea"})
    assert await _texts(other, ns, "u1", "coffee") == ["Buys coffee beans monthly"]
    assert len(reads) == n


async def test_as_of_reads_a_superseded_fact_the_cache_does_not_hold(call, ns, mint, other):
    w = mint(ns, "writer")
    await _set(
        call, w, ns, "u1", {"text": "Lives in Lisbon", "key": "home", "valid_from": "2026-01-01T00:00:00Z"}
    )
    await _set(
        call, w, ns, "u1", {"text": "Lives in Porto", "key": "home", "valid_from": "2026-06-01T00:00:00Z"}
    )
    assert await _texts(other, ns, "u1", "lives") == ["Lives in Porto"]
    march = utcnow().replace(year=2026, month=3, day=1)
    assert await _texts(other, ns, "u1", "lives", as_of=march) == ["Lives in Lisbon"]
    assert await _texts(other, ns, "u1", "lives") == ["Lives in Porto"]


async def test_time_moves_the_cached_current_facts(call, ns, mint, other, reads):
    """A cached read holds facts whose validity starts or ends later: each search keeps
    those valid at its own time, with no write in between."""
    w = mint(ns, "writer")
    soon = utcnow() + timedelta(seconds=2)
    await _set(
        call,
        w,
        ns,
        "u1",
        {"text": "On call this week", "valid_until": soon.isoformat()},
        {"text": "On leave next week", "valid_from": soon.isoformat()},
    )
    assert await _texts(other, ns, "u1", "week") == ["On call this week"]
    await asyncio.sleep(max(0.0, (soon - utcnow()).total_seconds()) + 0.2)
    assert await _texts(other, ns, "u1", "week") == ["On leave next week"]
    assert len(reads) == 1


async def test_a_user_erasure_retires_cached_reads(call, ns, mint, services, other):
    w, admin = mint(ns, "writer"), mint(ns, "admin")
    await _set(call, w, ns, "u1", {"text": "Collects vinyl records"})
    assert await _texts(other, ns, "u1", "vinyl") == ["Collects vinyl records"]
    who = Principal("adm", (ns,), Role.admin)
    await requesting.request(services, who, user_id="u1", namespaces=None, namespace_list=None, purge=False)
    assert await _texts(other, ns, "u1", "vinyl") == []
    del admin


async def test_a_namespace_erasure_retires_cached_reads(call, ns, mint, services, other):
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", {"text": "Collects vinyl records"})
    assert await _texts(other, ns, "u1", "vinyl") == ["Collects vinyl records"]
    who = Principal("adm", (ns,), Role.admin)
    await requesting.request(services, who, user_id=None, namespaces=None, namespace_list=[ns], purge=True)
    assert await _texts(other, ns, "u1", "vinyl") == []


async def test_a_lost_token_is_a_miss(call, ns, mint, services, other, reads):
    """A token gone from Redis (expired, evicted, a restart) is created afresh: a read
    cached under the old one is never used again."""
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", {"text": "Plays the cello"})
    assert await _texts(other, ns, "u1", "cello") == ["Plays the cello"]
    await services.redis.delete(redis_keys.memory_version(ns, "u1"))
    assert await _texts(other, ns, "u1", "cello") == ["Plays the cello"]
    assert len(reads) == 2
    await services.redis.delete(redis_keys.memory_version_of(ns))
    assert await _texts(other, ns, "u1", "cello") == ["Plays the cello"]
    assert len(reads) == 3


async def test_the_cache_is_bounded_and_can_be_off(call, ns, mint, other, reads):
    w = mint(ns, "writer")
    for user in ("u1", "u2", "u3"):
        await _set(call, w, ns, user, {"text": f"Likes cello, says {user}"})
    for user in ("u1", "u2", "u3"):
        await _texts(other, ns, user, "cello")
    cache = scan_cache.cache_of(other)
    assert cache is not None and len(cache.entries) == 3
    one = next(iter(cache.entries.values())).nbytes
    cache.max_bytes = 2 * one + one // 2  # room for two: the least recently used leaves
    cache.put(*next(iter((s, e.label, e.rows) for s, e in cache.entries.items())))
    assert len(cache.entries) == 2 and cache.nbytes <= cache.max_bytes
    off = dataclasses.replace(other, settings=other.settings.model_copy(update={"memory_search_cache_mb": 0}))
    n = len(reads)
    for _ in range(2):  # off: every search reads
        assert await _texts(off, ns, "u1", "cello") == ["Likes cello, says u1"]
    assert scan_cache.cache_of(off) is None and len(reads) == n + 2


async def test_a_read_that_raced_a_write_is_never_used(call, ns, mint, other, reads):
    """A search reads the token before the rows: a write that lands after the token read
    (whether the rows saw it or not) changes the token, so that read is not used again."""
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", {"text": "Plays the cello"})
    scope = Scope(ns, "u1")
    token = await scan_cache.label(other, scope)
    stale = memory_scan.read(other.ch, scope, cap=100, now=utcnow())
    assert stale is not None
    await _set(call, w, ns, "u1", {"text": "Plays the cello in a quartet"})
    cache = scan_cache.cache_of(other)
    assert cache is not None
    cache.put(scope, token, stale)  # what the racing search stored
    assert sorted(await _texts(other, ns, "u1", "cello")) == [
        "Plays the cello",
        "Plays the cello in a quartet",
    ]
