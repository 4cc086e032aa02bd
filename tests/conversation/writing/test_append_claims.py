"""Append's turn claims when their flush dies: a retry of a turn whose claimer died
mid-flush (after its claim, before its insert landed) is stored exactly once, never
answered `duplicate` for a row that never landed; a live flush's claim still dedups.

A killed flush leaves exactly this in Redis: the turn's claim (its flush id, an hour's
TTL) and its landed notes; its live mark (loom.redis_keys.append_flush) lapses within
FLUSH_LIVE_MS of the kill, since nothing renews it any more."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from loom import redis_keys
from loom.clock import next_version
from loom.ops.conversation.writing import appending
from loom.ops.conversation.writing.appending import CLAIM_TTL_S, claim_key
from loom.store import conversations as conv_store
from loom.store import landed
from tests.conversation.helpers import emb_row, turn_rows

DEAD = "0123456789abcdef0123456789abcdef"  # the flush id of a flush that was killed
TEXT = "the invoices moved to the new ledger"


def _key(ns: str, msg_id: str = "m1") -> conv_store.TurnKey:
    return (ns, "default", "t", msg_id)


async def _killed_flush(services: Any, key: conv_store.TurnKey, *, live_ms: int | None = None) -> None:
    """The Redis state a flush leaves when its process is SIGKILLed between its claim
    and its insert: the claim and the notes; its live mark only if it died less than
    FLUSH_LIVE_MS ago (`live_ms`: what is left of it)."""
    await services.redis.set(claim_key(key), DEAD, ex=CLAIM_TTL_S)
    await landed.note(services.redis, [key])
    if live_ms is not None:
        await services.redis.set(redis_keys.append_flush(DEAD), "1", px=live_ms)


async def _append(call: Any, token: str, ns: str, msg_id: str = "m1") -> Any:
    return await call(
        "conversation.append", token, namespace=ns, thread_id="t", msg_id=msg_id, role="user", content=TEXT
    )


def _row(ns: str, msg_id: str = "m1") -> conv_store.Turn:
    return conv_store.Turn(
        ns, "default", "t", msg_id, datetime.now(UTC), "user", TEXT, version=next_version()
    )


async def test_a_retry_after_the_claimer_died_stores_the_turn_once(call, ns, writer, services):
    await _killed_flush(services, _key(ns))
    r = await _append(call, writer, ns)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] is True and r.json()["embedding"] == "embedded"
    assert [row["msg_id"] for row in turn_rows(services.ch, ns, final=False)] == ["m1"]
    assert emb_row(services.ch, ns, "t", "m1") is not None
    # A further retry is a duplicate of the row that landed, still one row.
    again = await _append(call, writer, ns)
    assert again.json()["stored"] is False and again.json()["reason"] == "duplicate"
    assert len(turn_rows(services.ch, ns, final=False)) == 1
    listed = await call("conversation.list", writer, namespace=ns, thread_id="t")
    assert [m["msg_id"] for m in listed.json()["messages"]] == ["m1"]


async def test_a_retry_soon_after_the_death_waits_for_the_live_mark_to_lapse(call, ns, writer, services):
    await _killed_flush(services, _key(ns), live_ms=400)
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await _append(call, writer, ns)
    assert r.json()["stored"] is True, r.text
    assert loop.time() - started >= 0.3  # not before the dead flush could no longer land
    assert len(turn_rows(services.ch, ns, final=False)) == 1


async def test_a_retry_when_the_dead_flush_had_landed_is_a_duplicate(call, ns, writer, services):
    """Killed after its insert, before its answer: the row is there, the retry says so."""
    key = _key(ns)
    await _killed_flush(services, key)
    conv_store.insert(services.ch, [_row(ns)])
    r = await _append(call, writer, ns)
    assert r.json()["stored"] is False and r.json()["reason"] == "duplicate"
    assert len(turn_rows(services.ch, ns, final=False)) == 1
    assert await services.redis.get(claim_key(key)) is None  # taken over, then not needed


async def test_a_live_flush_still_dedups_once_its_row_lands(call, ns, writer, services):
    """Another process's flush holds the claim and is alive: the append waits for its
    row and answers duplicate (never a second row, never a duplicate before it landed)."""
    key = _key(ns)
    await _killed_flush(services, key, live_ms=10_000)  # alive: its mark lives
    pending = asyncio.ensure_future(_append(call, writer, ns))
    await asyncio.sleep(0.4)
    assert not pending.done()  # not answered while the row has not landed
    conv_store.insert(services.ch, [_row(ns)])  # the live flush's insert lands
    r = await pending
    assert r.json()["stored"] is False and r.json()["reason"] == "duplicate"
    assert len(turn_rows(services.ch, ns, final=False)) == 1
    assert (await services.redis.get(claim_key(key))).decode() == DEAD  # never taken from it


async def test_a_live_flush_that_releases_its_claim_lets_the_waiter_store(call, ns, writer, services):
    key = _key(ns)
    await _killed_flush(services, key, live_ms=10_000)
    pending = asyncio.ensure_future(_append(call, writer, ns))
    await asyncio.sleep(0.3)
    await services.redis.delete(claim_key(key))  # its insert failed: it released the claim
    r = await pending
    assert r.json()["stored"] is True
    assert len(turn_rows(services.ch, ns, final=False)) == 1


async def test_a_live_flush_that_never_finishes_is_answered_503_not_duplicate(
    call, ns, writer, services, monkeypatch
):
    monkeypatch.setattr(appending, "CONTEST_WAIT_S", 0.5)
    key = _key(ns)
    await _killed_flush(services, key, live_ms=10_000)
    r = await _append(call, writer, ns)
    assert r.status_code == 503 and r.json()["error"] == "unavailable"
    assert r.headers.get("retry-after")
    assert turn_rows(services.ch, ns, final=False) == []


async def test_a_batch_with_a_dead_claim_stores_its_other_turns_too(call, ns, writer, services):
    await _killed_flush(services, _key(ns, "m2"))
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[
            {"thread_id": "t", "msg_id": m, "role": "user", "content": f"{TEXT} {m}"}
            for m in ("m1", "m2", "m3")
        ],
    )
    assert [x["stored"] for x in r.json()["results"]] == [True, True, True]
    assert sorted(row["msg_id"] for row in turn_rows(services.ch, ns, final=False)) == ["m1", "m2", "m3"]


async def test_two_versions_of_one_turn_read_as_one_row(call, ns, writer, services):
    """What a take-over of a flush that was alive after all (a stall past its mark) can
    leave: two inserts of the same turn under different tokens, of different versions
    or the same one. The table (ReplacingMergeTree by version) and every read (FINAL)
    keep one."""
    first = _row(ns)
    later = conv_store.Turn(**{**first.__dict__, "version": next_version()})
    conv_store.insert(services.ch, [first], dedup_token="a")
    conv_store.insert(services.ch, [later], dedup_token="b")
    conv_store.insert(services.ch, [later], dedup_token="c")  # the same version once more
    assert len(turn_rows(services.ch, ns, final=False)) == 3  # unmerged parts
    assert len(turn_rows(services.ch, ns)) == 1
    listed = await call("conversation.list", writer, namespace=ns, thread_id="t")
    assert [m["msg_id"] for m in listed.json()["messages"]] == ["m1"]


async def test_two_flushes_waiting_on_each_other_do_not_wait_out_the_limit(call, ns, writer, services):
    """A live flush that is itself waiting (on a turn this append's flush may hold) and
    has the smaller id holds the turn: this flush gives up at once (503, claims
    released), so that of two flushes holding each other's turns one goes on."""
    key = _key(ns)
    older = "0" * 32  # smaller than any flush id
    await services.redis.set(claim_key(key), older, ex=CLAIM_TTL_S)
    await services.redis.set(redis_keys.append_flush(older), "waiting", px=10_000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[
            {"thread_id": "t", "msg_id": "m0", "role": "user", "content": "a turn of its own"},
            {"thread_id": "t", "msg_id": "m1", "role": "user", "content": TEXT},
        ],
    )
    assert r.status_code == 503, r.text
    assert loop.time() - started < appending.CONTEST_WAIT_S / 2
    assert await services.redis.get(claim_key(_key(ns, "m0"))) is None  # its own claims released
    assert turn_rows(services.ch, ns, final=False) == []


async def test_a_waiting_holder_with_the_larger_id_is_waited_for(call, ns, writer, services):
    key = _key(ns)
    younger = "g" * 32  # larger than any flush id: this flush waits, the other gives up
    await services.redis.set(claim_key(key), younger, ex=CLAIM_TTL_S)
    await services.redis.set(redis_keys.append_flush(younger), "waiting", px=10_000)
    pending = asyncio.ensure_future(_append(call, writer, ns))
    await asyncio.sleep(0.3)
    assert not pending.done()
    await services.redis.delete(claim_key(key))  # it gave up: released its claims
    r = await pending
    assert r.json()["stored"] is True
    assert len(turn_rows(services.ch, ns, final=False)) == 1
