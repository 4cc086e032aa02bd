"""A save's claim on a new turn is a live writer's, like an append flush's: an append of
the turn waits on a live save for its row, goes on at once when the save failed (it
releases its claim) and takes the claim over once a save that died stopped being live,
so no append is answered `duplicate` (or `deleted`) for a row that never landed; and a
save waits on a live flush's claim the same way.

A save killed between its claim and its insert leaves exactly this in Redis: the turn's
claim (``save:`` and its token, an hour's TTL) and its landed notes; its live mark
(loom.redis_keys.append_flush of the claim value) lapses within FLUSH_LIVE_MS, since
nothing renews it any more."""

from __future__ import annotations

import asyncio
import random
import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from loom import redis_keys
from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.models.conversation.saved import SaveResponse
from loom.ops.conversation import append
from loom.ops.conversation.saved import saving
from loom.ops.conversation.writing.appending import CLAIM_TTL_S, claim_key
from loom.store import conversations as conv_store
from loom.store import landed
from tests.conversation.helpers import alice_saves, emb_row, turn, turn_rows

TEXT = "the invoices moved to the new ledger"


@pytest.fixture
def save_claim() -> str:
    """A save's claim value (its live mark is keyed by it: one per test)."""
    return f"{landed.SAVE_CLAIM_PREFIX}save-{secrets.token_hex(20)}"


@pytest.fixture
def flush_id() -> str:
    return secrets.token_hex(16)


def _key(ns: str, msg_id: str = "m1") -> conv_store.TurnKey:
    return (ns, "default", "t", msg_id)


async def _holder(services: Any, key: conv_store.TurnKey, value: str, *, live_ms: int | None = None) -> None:
    """What a writer (a save or a flush) leaves after its claim, before its insert: the
    claim and the notes, and its live mark while it lives (`live_ms` of it left)."""
    await services.redis.set(claim_key(key), value, ex=CLAIM_TTL_S)
    await landed.note(services.redis, [key])
    if live_ms is not None:
        await services.redis.set(redis_keys.append_flush(value), "1", px=live_ms)


async def _append(call: Any, token: str, ns: str, msg_id: str = "m1") -> Any:
    return await call(
        "conversation.append", token, namespace=ns, thread_id="t", msg_id=msg_id, role="user", content=TEXT
    )


def _saved_only_row(ns: str, msg_id: str = "m1") -> conv_store.Turn:
    """The row a save of a new message inserts."""
    now = datetime.now(UTC)
    return conv_store.Turn(
        ns,
        "default",
        "t",
        msg_id,
        now,
        "user",
        TEXT,
        user_id="alice",
        is_saved=True,
        saved_at=now,
        origin=conv_store.SAVED_ONLY,
        version=next_version(),
    )


def _recorded_row(ns: str, msg_id: str = "m1") -> conv_store.Turn:
    """The row an append's flush inserts."""
    return conv_store.Turn(
        ns, "default", "t", msg_id, datetime.now(UTC), "user", TEXT, version=next_version()
    )


async def _save_new(services: Any, ns: str, msg_id: str = "m1", thread_id: str = "t") -> SaveResponse:
    who = Principal("t", (ns,), Role.writer)
    return await saving.save_message(
        services, who, alice_saves(ns, thread_id, msg_id, role="user", content=TEXT)
    )


# -- an append and a save's claim ------------------------------------------------------------


async def test_an_append_after_a_save_died_stores_the_turn(call, ns, writer, services, save_claim):
    """The save died between its claim and its insert: nothing landed, so the append
    stores the turn (it used to answer as if a saved row were there, for an hour)."""
    await _holder(services, _key(ns), save_claim)
    r = await _append(call, writer, ns)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] is True and r.json()["embedding"] == "embedded", r.json()
    [row] = turn_rows(services.ch, ns, final=False)
    assert row["origin"] == "recorded" and row["is_saved"] is False
    assert emb_row(services.ch, ns, "t", "m1") is not None
    again = await _append(call, writer, ns)
    assert again.json()["reason"] == "duplicate"
    assert len(turn_rows(services.ch, ns, final=False)) == 1


async def test_an_append_after_a_save_died_after_its_insert_records_the_saved_row(
    call, ns, writer, services, save_claim
):
    """Killed after its insert: the saved-only row is there; the append is a duplicate
    of it and makes it recorded, as for a save that finished."""
    await _holder(services, _key(ns), save_claim)
    conv_store.insert(services.ch, [_saved_only_row(ns)])
    r = await _append(call, writer, ns)
    assert r.json()["stored"] is False and r.json()["reason"] == "duplicate", r.json()
    [row] = turn_rows(services.ch, ns)
    assert row["origin"] == "recorded" and row["is_saved"] is True and row["user_id"] == "alice"


async def test_an_append_waits_for_a_live_saves_row(call, ns, writer, services, save_claim):
    key = _key(ns)
    await _holder(services, key, save_claim, live_ms=10_000)
    pending = asyncio.ensure_future(_append(call, writer, ns))
    await asyncio.sleep(0.4)
    assert not pending.done()  # not answered while the save's row has not landed
    conv_store.insert(services.ch, [_saved_only_row(ns)])  # the live save's insert lands
    r = await pending
    assert r.json()["stored"] is False and r.json()["reason"] == "duplicate", r.json()
    [row] = turn_rows(services.ch, ns)
    assert row["origin"] == "recorded" and row["is_saved"] is True  # the append recorded it
    assert (await services.redis.get(claim_key(key))).decode() == save_claim  # never taken from it


async def test_an_append_waiting_on_a_save_that_failed_stores_the_turn(
    call, ns, writer, services, save_claim
):
    key = _key(ns)
    await _holder(services, key, save_claim, live_ms=10_000)
    pending = asyncio.ensure_future(_append(call, writer, ns))
    await asyncio.sleep(0.3)
    await services.redis.delete(claim_key(key))  # its insert failed: it released the claim
    r = await pending
    assert r.json()["stored"] is True, r.json()
    assert len(turn_rows(services.ch, ns, final=False)) == 1


async def test_a_save_whose_insert_fails_releases_its_claim(call, ns, writer, services, monkeypatch):
    """The save's insert raises (the store refused it): the save answers its error, and
    the turn's claim is gone, so an append of it is stored at once."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the store went away")

    monkeypatch.setattr(conv_store, "insert", refused)
    try:
        await _save_new(services, ns)
        raise AssertionError("the save should have failed")
    except ConnectionError:
        pass
    monkeypatch.undo()
    assert await services.redis.get(claim_key(_key(ns))) is None
    r = await _append(call, writer, ns)
    assert r.json()["stored"] is True, r.json()
    assert len(turn_rows(services.ch, ns, final=False)) == 1


# -- a save and a flush's claim ----------------------------------------------------------


async def test_a_save_waits_on_a_live_flush_and_saves_its_row_in_place(ns, writer, services, flush_id):
    """A flush holds the turn and is alive (a slow insert): the save waits for its row
    (it used to take the claim over after 2 s and insert a second, saved-only row) and
    then flags that row in place."""
    await _holder(services, _key(ns), flush_id, live_ms=20_000)
    pending = asyncio.ensure_future(_save_new(services, ns))
    await asyncio.sleep(2.5)
    assert not pending.done()
    conv_store.insert(services.ch, [_recorded_row(ns)])  # the live flush's insert lands
    saved = await pending
    assert saved.saved is True
    rows = turn_rows(services.ch, ns, final=False)
    assert {r["origin"] for r in rows} == {"recorded"}  # no saved-only row was inserted
    [row] = turn_rows(services.ch, ns)
    assert row["is_saved"] is True and row["user_id"] == "alice"


async def test_a_save_takes_over_a_dead_flushs_claim(ns, writer, services, flush_id):
    key = _key(ns)
    await _holder(services, key, flush_id)  # died before its insert: no live mark
    saved = await _save_new(services, ns)
    assert saved.saved is True
    [row] = turn_rows(services.ch, ns, final=False)
    assert row["origin"] == "saved" and row["is_saved"] is True
    assert (await services.redis.get(claim_key(key))).decode().startswith(landed.SAVE_CLAIM_PREFIX)


# -- racing on the real engines ----------------------------------------------------------


async def test_saves_and_appends_racing_with_saves_cut_short_never_lose_a_turn(ns, writer, services):
    """Twenty new turns (each in a thread of its own: one thread's lease would make
    them queue), each saved and appended at once; every other save is cancelled a few
    milliseconds in (a client gone mid-save). Whatever the interleaving: every
    turn reads as one row; an append answered `duplicate` only for a row that landed
    (never `deleted`); a save that answered flagged the row."""
    who = Principal("t", (ns,), Role.writer)
    rng = random.Random(17)

    async def cut(msg_id: str) -> SaveResponse | None:
        task = asyncio.ensure_future(_save_new(services, ns, msg_id, msg_id))
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return None

    ids = [f"m{i:02d}" for i in range(20)]
    saves = [cut(m) if i % 2 else _save_new(services, ns, m, m) for i, m in enumerate(ids)]
    appends = [append(services, who, ns, "default", [turn(m, "user", TEXT, msg_id=m)]) for m in ids]
    got = await asyncio.gather(*saves, *appends)
    saved, appended = got[: len(ids)], [r[0] for r in got[len(ids) :]]
    rows = {r["msg_id"]: r for r in turn_rows(services.ch, ns)}
    for msg_id, s, a in zip(ids, saved, appended, strict=True):
        assert a.stored or a.reason == "duplicate", (msg_id, a)
        assert msg_id in rows, (msg_id, a, s)  # stored, or a duplicate of a row that is there
        if s is not None:
            assert s.saved is True and rows[msg_id]["is_saved"], (msg_id, s)
        # The namespace records: whichever landed first, the turn ends in the transcript.
        assert rows[msg_id]["origin"] == "recorded", (msg_id, rows[msg_id], a, s)
    assert len(rows) == len(ids)
