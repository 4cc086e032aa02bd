"""conversation.search answers fresh vector rows without verifying them, and only those:
the marks of loom.store.search_marks (raised by every writer that rewrites or removes
existing rows), a Redis restart, a mark that moves mid-search, the retention TTL."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.models.conversation.saved import UnsaveRequest
from loom.ops.conversation.reading import searching
from loom.ops.conversation.reading.searching import _Trust
from loom.ops.conversation.saved import saving
from loom.store import search as store
from loom.store import search_marks
from loom.store.search import Candidate
from tests.conversation.helpers import alice_saves, ok, tombstone_turn, turn_rows

TEXT = "the staging cluster deploy rolled back after the canary failed"


async def _trust_all(services: Any, ns: str) -> None:
    """As if the namespace's last change were long ago: every row so far is fresh."""
    run = (await services.redis.info("server"))["run_id"]
    await services.redis.delete(search_marks.key(ns))
    await services.redis.hset(search_marks.key(ns), "@run", run)


async def _mark(services: Any, ns: str, thread_id: str = "t") -> int:
    return (await search_marks.read(services.redis, services.ch, services.run, [(ns, thread_id)]))[
        (ns, thread_id)
    ]


async def _raise(services: Any, ns: str, thread_id: str = search_marks.WHOLE) -> None:
    await search_marks.raise_marks(services.redis, services.ch, services.run, [(ns, thread_id)])


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many candidates each verification read was asked about."""
    calls: list[int] = []
    real = store.verify_turns

    def spy(ch: Any, keys: Any, agents: Any) -> Any:
        calls.append(len(keys))
        return real(ch, keys, agents)

    monkeypatch.setattr(store, "verify_turns", spy)
    return calls


def _who(ns: str, role: Role = Role.viewer) -> Principal:
    return Principal("test", (ns,), role)


async def _append(call: Any, writer: str, ns: str, msg_id: str, content: str = TEXT, **kw: Any) -> None:
    body = await ok(
        call,
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t",
        msg_id=msg_id,
        role="user",
        content=content,
        **kw,
    )
    assert body["stored"] and body["embedding"] == "embedded", body


async def test_fresh_rows_are_answered_as_written_without_verification(
    call, ns, writer, services, verifications
):
    await _append(call, writer, ns, "m", user_id="ann", run_id="r7")
    await _trust_all(services, ns)
    fresh = await searching.search(services, _who(ns), "staging deploy rolled back")
    assert verifications == []
    await _raise(services, ns)  # now every row so far is verified
    checked = await searching.search(services, _who(ns), "staging deploy rolled back")
    assert verifications and fresh.hits == checked.hits
    hit = fresh.hits[0]
    row = turn_rows(services.ch, ns)[0]
    assert (hit.msg_id, hit.user_id, hit.run_id, hit.role) == ("m", "ann", "r7", "user")
    assert hit.ts == row["ts"].replace(tzinfo=UTC)


async def test_a_change_to_one_thread_leaves_the_others_trusted(call, ns, writer, services, verifications):
    await _append(call, writer, ns, "m")
    await ok(
        call,
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="u",
        msg_id="n",
        role="user",
        content=TEXT + " again",
    )
    await _trust_all(services, ns)
    await _raise(services, ns, "u")
    result = await searching.search(services, _who(ns), "staging deploy rolled back")
    assert {h.msg_id for h in result.hits} == {"m", "n"}
    assert verifications == [1]  # only thread u's turn
    verifications.clear()
    await _raise(services, ns)  # the whole namespace
    await searching.search(services, _who(ns), "staging deploy rolled back")
    assert verifications == [2]


async def test_the_marks_survive_a_lost_cache_or_a_redis_restart(call, ns, writer, services, verifications):
    """ClickHouse holds the marks; Redis only caches them, loaded per namespace and
    tagged with the run_id of the Redis process that loaded them."""
    assert await _mark(services, ns) == 0  # never changed
    await _append(call, writer, ns, "m")
    before = time.time_ns()
    await _raise(services, ns, "t")
    raised = await _mark(services, ns)
    assert raised >= before + search_marks.CLOCK_MARGIN_NS
    await services.redis.delete(search_marks.key(ns))  # evicted
    assert await _mark(services, ns) >= raised
    await services.redis.delete(search_marks.key(ns))
    await services.redis.hset(
        search_marks.key(ns), mapping={"@run": "a0previous0run", "t:t": "0"}
    )  # a restart
    assert await _mark(services, ns) >= raised
    await searching.search(services, _who(ns), "staging deploy rolled back")
    assert verifications


async def test_a_raise_racing_a_load_is_kept(services, ns):
    """A raise writes ClickHouse, then the cache even where it is not loaded; a load
    merges by max, so whichever lands last, the larger mark stays."""
    await _raise(services, ns, "t")
    first = await _mark(services, ns)
    await services.redis.delete(search_marks.key(ns))
    await _raise(services, ns, "t")  # lands in an unloaded cache
    second = await _mark(services, ns)  # the load merges the older truth
    assert second > first


async def test_a_save_raises_the_mark_so_search_shows_the_new_owner(
    call, ns, writer, services, verifications
):
    await _append(call, writer, ns, "m")
    await _trust_all(services, ns)
    before = time.time_ns()
    saved = await saving.save_message(services, _who(ns, Role.writer), alice_saves(ns, "t"))
    assert saved.saved and saved.indexed
    assert await _mark(services, ns) > before
    result = await searching.search(services, _who(ns), "staging deploy rolled back")
    assert verifications and [(h.msg_id, h.user_id) for h in result.hits] == [("m", "alice")]


async def test_a_removed_unsaved_turn_is_never_found(call, ns, mint, recording, services):
    """A message stored only by a save is its user's: conversation.search never answers
    it, not even as a fresh row it would answer unverified, and after the unsave
    removed it neither."""
    recording(ns, False)
    who = _who(ns, Role.writer)
    assert (await saving.save_message(services, who, alice_saves(ns, "c", role="user", content=TEXT))).indexed
    await _trust_all(services, ns)
    assert (await searching.search(services, _who(ns), "staging deploy")).hits == []
    recording(ns, True)  # the switch does not decide what unsave does
    removed = await saving.unsave_message(
        services, who, UnsaveRequest(namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    )
    assert removed.found and removed.removed
    await _trust_all(services, ns)
    assert (await searching.search(services, _who(ns), "staging deploy")).hits == []
    assert turn_rows(services.ch, ns) == []


async def test_a_reembed_raises_the_mark(call, ns, writer, mint, services):
    await _append(call, writer, ns, "m")
    await _trust_all(services, ns)
    before = time.time_ns()
    await ok(call, "conversation.reembed", mint(ns, "admin"), namespace=ns)
    assert await _mark(services, ns) > before


async def test_a_change_that_ends_before_the_marks_are_read_is_seen(
    call, ns, writer, services, monkeypatch, verifications
):
    """The marks are read after the candidate query: a deletion that happened in
    between (after the candidates were read) raised them, and its turn is not answered."""
    await _append(call, writer, ns, "m")
    await _trust_all(services, ns)
    real = search_marks.read
    reads = 0

    async def read(redis: Any, ch: Any, run: Any, pairs: Any) -> dict[Any, int]:
        nonlocal reads
        reads += 1
        tombstone_turn(services.ch, ns, "default", "t", "m")  # raises the mark first
        return await real(redis, ch, run, pairs)

    monkeypatch.setattr(search_marks, "read", read)
    result = await searching.search(services, _who(ns), "staging deploy rolled back")
    assert reads == 1 and verifications and result.hits == []


def _candidate(version: int, ts: datetime, msg_id: str = "m", model: str = "fake-hash-384") -> Candidate:
    return Candidate("ns", "t", msg_id, version, "default", "user", "", "", ts, "text", 0.9, model)


def test_trust_covers_only_fresh_single_rows_not_due_to_the_ttl():
    now = datetime.now(UTC)
    trust = _Trust(expires_before=now - timedelta(days=30))
    marks = {("ns", "t"): 100}
    assert trust.covers(_candidate(101, now), marks, set())
    assert not trust.covers(_candidate(100, now), marks, set())  # at or below the mark
    assert not trust.covers(
        _candidate(101, now), marks, {("ns", "t", "m")}
    )  # two versions among the candidates
    assert not trust.covers(_candidate(101, now - timedelta(days=31)), marks, set())  # the TTL may have run
    assert not trust.covers(_candidate(101, now), {}, set())  # no mark read: verify
    assert not trust.covers(_candidate(101, now), {("ns", "t"): -1}, set())  # not loaded: verify
    # A row older than the vector tables' model column: its model is checked on its embedding row.
    assert not trust.covers(_candidate(101, now, model=""), marks, set())
