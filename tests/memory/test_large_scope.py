"""memory.search of a scope above the one-read cap from the API process's index of it
(loom.ops.memory.large_scope, loom.store.memory_index): the same answer as the
server-side legs, and every rule of the current facts kept (scope, tombstones,
supersession, validity, high text refused). The cap is injected small (3 facts), and
searches go through another Services (a process with a cache of its own)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.models.memory import MemorySearchRequest
from loom.ops.memory import facts, large_scope, scan_cache
from loom.store import memory_index
from loom.store.memories import Scope
from tests.memory.conftest import record_arg

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def other(services: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Another Services over the same backends, with caches of its own; the one-read cap
    at 3 facts, and an index read allowed at every search."""
    monkeypatch.setattr(facts, "SCAN_MAX_FACTS", 3)
    monkeypatch.setattr(large_scope, "FILL_INTERVAL_S", 0.0)
    return dataclasses.replace(services, extras={})


@pytest.fixture
def ranked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """How many searches the index ranked (its BM25 leg runs once per search)."""
    return record_arg(monkeypatch, memory_index, "lexical", 0)


async def _hits(svc: Any, ns: str, user: str, query: str, **kw: Any) -> list[Any]:
    who = Principal("t", (ns,), Role.viewer)
    return (
        await facts.search(
            svc, who, MemorySearchRequest(namespace=ns, user_id=user, query=query, limit=20, **kw)
        )
    ).hits


async def _indexed(svc: Any, ns: str, user: str, query: str, **kw: Any) -> list[str]:
    """The texts a search answers once the scope's index is current (the first search
    after a write is ranked by the server and starts the index's read)."""
    await _hits(svc, ns, user, query, **kw)
    await large_scope.settle(svc)
    return [h.fact.text for h in await _hits(svc, ns, user, query, **kw)]


async def _set(call: Any, token: str, ns: str, user: str, *items: dict[str, Any], **extra: Any) -> list[Any]:
    r = await call("memory.set", token, namespace=ns, user_id=user, facts=list(items), **extra)
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


FACTS = [
    {"text": "Drinks coffee every morning in Kyoto"},
    {"text": "Grows coffee plants in the garden"},
    {"text": "Plays the cello on Sundays"},
    {"text": "Keeps the coffee ledger for the office"},
    {"text": "Prefers green tea in the garden"},
    {"text": "Pays the invoice by the billing portal"},
]


async def test_the_index_answers_as_the_server_legs(call, ns, mint, other, ranked, monkeypatch):
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", *FACTS)
    await _set(call, w, ns, "u1", {"text": "Brews coffee in the session garden"}, session_id="s1")
    await _set(call, w, ns, "u2", {"text": "Drinks coffee in the garden too"})
    queries = ["coffee garden", "cello", "kyoto morning coffee", "billing invoice", "nothing matches zzz"]
    await _indexed(other, ns, "u1", "coffee")
    via_index = {}
    for q in queries:
        via_index[q] = [
            (h.fact.memory_id, h.score, h.legs, h.similarity, h.bm25) for h in await _hits(other, ns, "u1", q)
        ]
    assert len(ranked) == 1 + len(queries)  # every search after the read came from the index
    monkeypatch.setattr(facts, "SCAN_MAX_FACTS", 0)  # the server-side legs
    for q in queries:
        ref = [
            (h.fact.memory_id, h.score, h.legs, h.similarity, h.bm25) for h in await _hits(other, ns, "u1", q)
        ]
        got = via_index[q]
        assert [x[:3] for x in got] == [x[:3] for x in ref], q
        for a, b in zip(got, ref, strict=True):
            assert (a[3] is None) == (b[3] is None) and abs((a[3] or 0) - (b[3] or 0)) < 1e-4
            assert (a[4] is None) == (b[4] is None) and abs((a[4] or 0) - (b[4] or 0)) < 1e-4
    assert len(via_index["coffee garden"]) == 5  # u1's four coffee or garden facts and the session's


async def test_the_index_keeps_the_current_facts_rules(call, ns, mint, other, ranked, leak_spy):
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", *FACTS, {"text": "Buys coffee beans weekly", "key": "beans"})
    assert "Buys coffee beans weekly" in await _indexed(other, ns, "u1", "coffee")
    # a key set again with another text supersedes: the old text leaves
    await _set(call, w, ns, "u1", {"text": "Buys coffee beans monthly", "key": "beans"})
    got = await _indexed(other, ns, "u1", "coffee beans")
    assert "Buys coffee beans monthly" in got and "Buys coffee beans weekly" not in got
    # a delete (tombstone) is seen at once (the token changed: the server ranks) and after
    listed = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    kyoto = next(f["memory_id"] for f in listed if "Kyoto" in f["text"])
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[kyoto])
    assert r.status_code == 200, r.text
    assert all("Kyoto" not in h.fact.text for h in await _hits(other, ns, "u1", "kyoto coffee"))
    assert all("Kyoto" not in t for t in await _indexed(other, ns, "u1", "kyoto coffee"))
    # a high fact is refused, never stored: no search finds it
    out = await _set(call, w, ns, "u1", {"text": "coffee: my SSN is 123-45-6789"})
    assert out[0]["reason"] == "high_sensitivity"
    assert all("SSN" not in t for t in await _indexed(other, ns, "u1", "coffee ssn"))
    # the scope: another user's and another session's facts stay out
    await _set(call, w, ns, "u2", {"text": "Drinks coffee in Kyoto as well"})
    await _set(call, w, ns, "u1", *FACTS[:4], {"text": "Kyoto coffee in session two"}, session_id="s2")
    await _set(call, w, ns, "u1", *FACTS[:4], {"text": "Kyoto coffee in session three"}, session_id="s3")
    assert all("as well" not in t for t in await _indexed(other, ns, "u1", "kyoto coffee"))
    in_s2 = await _indexed(other, ns, "u1", "kyoto coffee", session_id="s2")
    assert "Kyoto coffee in session two" in in_s2 and "Kyoto coffee in session three" not in in_s2
    assert ranked  # the index did rank


async def test_time_moves_the_indexed_current_facts(call, ns, mint, other, ranked):
    w = mint(ns, "writer")
    soon = utcnow() + timedelta(seconds=2)
    await _set(
        call,
        w,
        ns,
        "u1",
        *FACTS,
        {"text": "On call this week", "valid_until": soon.isoformat()},
        {"text": "On leave next week", "valid_from": soon.isoformat()},
    )
    assert await _indexed(other, ns, "u1", "week") == ["On call this week"]
    n = len(ranked)
    await asyncio.sleep(max(0.0, (soon - utcnow()).total_seconds()) + 0.2)
    assert [h.fact.text for h in await _hits(other, ns, "u1", "week")] == ["On leave next week"]
    assert len(ranked) == n + 1  # from the same index, with no write in between


async def test_a_stale_index_is_never_used_and_its_hits_are_checked(call, ns, mint, other, ranked):
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", *FACTS)
    scope = Scope(ns, "u1")
    token = await scan_cache.label(other, scope)
    stale = memory_index.read(other.ch, scope, now=utcnow())
    cache = large_scope.cache_of(other)
    assert cache is not None
    # a write after the token read: an index stored under that token is not used
    await _set(call, w, ns, "u1", {"text": "Plays the cello in a quartet"})
    cache.put(scope, token, stale)
    got = [h.fact.text for h in await _hits(other, ns, "u1", "cello")]
    assert sorted(got) == ["Plays the cello in a quartet", "Plays the cello on Sundays"]
    assert not ranked
    # a writer that died before changing the token: the index holds a forgotten fact, but
    # each hit's row is read and checked, so it is not answered
    listed = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    sundays = next(f["memory_id"] for f in listed if "Sundays" in f["text"])
    await large_scope.settle(other)  # the read the miss above started
    held = memory_index.read(other.ch, scope, now=utcnow())
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[sundays])
    assert r.status_code == 200, r.text
    cache.put(scope, await scan_cache.label(other, scope), held)
    assert [h.fact.text for h in await _hits(other, ns, "u1", "cello")] == ["Plays the cello in a quartet"]
    assert len(ranked) == 1


async def test_the_index_can_be_off(call, ns, mint, other, ranked):
    off = dataclasses.replace(
        other, settings=other.settings.model_copy(update={"memory_large_scope_cache_mb": 0})
    )
    w = mint(ns, "writer")
    await _set(call, w, ns, "u1", *FACTS)
    assert "Plays the cello on Sundays" in await _indexed(off, ns, "u1", "cello")
    assert not ranked and large_scope.cache_of(off) is None


def test_the_index_ranks_exactly_and_skips_what_has_no_cosine():
    """memory_index alone: cosine over the facts of the query's model with a usable
    vector, ties by id; BM25 over the facts valid at the search's time; an empty scope."""
    import numpy as np

    def vec(*xs: float) -> bytes:
        return np.asarray(xs, dtype="<f4").tobytes()

    now, later = 1_000, 2_000
    never = int(np.iinfo(np.int64).max)
    index = memory_index.build(
        ids=["b", "a", "c", "d", "e"],
        postings=memory_index.text_postings(
            ["coffee in kyoto", "coffee", "tea", "coffee coffee", "later coffee"]
        ),
        lengths=[3, 1, 1, 2, 2],
        models=["m", "m", "other", "m", ""],
        created=[1, 1, 1, 1, 1],
        starts=[0, 0, 0, 0, later],
        ends=[never, never, never, never, never],
        vecs=[vec(1, 0), vec(2, 0), vec(1, 0), vec(0, 0), b""],
    )
    sims = memory_index.vector(index, [3.0, 0.0], "m", at_ms=now, limit=10, min_similarity=-1.0)
    assert [(h.memory_id, round(h.score, 6)) for h in sims] == [("a", 1.0), ("b", 1.0)]
    lex = memory_index.lexical(index, "coffee kyoto", at_ms=now, limit=10)
    assert [h.memory_id for h in lex] == ["b", "d", "a"] and lex[0].matched == ("coffee", "kyoto")
    assert "e" in [h.memory_id for h in memory_index.lexical(index, "coffee", at_ms=later, limit=10)]
    empty = memory_index.build([], [], [], [], [], [], [], postings=memory_index.text_postings([]))
    assert memory_index.lexical(empty, "coffee", at_ms=now, limit=10) == []
    assert memory_index.vector(empty, [1.0, 0.0], "m", at_ms=now, limit=10, min_similarity=0.0) == []
