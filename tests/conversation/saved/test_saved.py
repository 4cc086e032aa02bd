"""conversation.save_message and conversation.unsave_message: every rule and reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from loom.auth.principal import Principal, Role
from loom.ops.conversation import append
from loom.ops.conversation.saved import saving
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from loom.store import namespaces
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import (
    SAVE,
    alice_saves,
    emb_row,
    emb_rows,
    ok,
    revise_turn,
    save,
    tombstone_turn,
    turn,
    turn_rows,
)

UNSAVE = "conversation.unsave_message"
HIGH = "sure, the prod login is password=Tr0ub4dor&3xq"


@pytest.fixture
def token(ns: str, mint: Any) -> str:
    """A writer for a namespace that does NOT record (the default)."""
    return str(mint(ns, "writer"))


async def _append(call: Any, token: str, ns: str, **turn: Any) -> dict[str, Any]:
    body = await ok(call, "conversation.append", token, namespace=ns, **turn)
    assert body["stored"] is True, body
    return body


def _raw_rows(services: Any, ns: str) -> list[dict[str, Any]]:
    return turn_rows(services.ch, ns, final=False)


# -- storing and flagging ---------------------------------------------------------------


async def test_save_works_without_recording_and_does_not_turn_it_on(call, ns, token, services):
    body = await save(
        call,
        token,
        namespace=ns,
        conversation_id="c1",
        message_id="m1",
        role="assistant",
        content="The invoices moved to the new ledger on Friday.",
        run_id="r9",
        metadata={"k": "v"},
        ts="2025-03-01T10:00:00Z",
    )
    assert body["saved"] is True and body["indexed"] is True and body["reason"] is None
    assert body["conversation_id"] == "c1" and body["message_id"] == "m1" and body["saved_at"]
    [row] = turn_rows(services.ch, ns)
    assert row["user_id"] == "alice" and row["is_saved"] is True and row["saved_at"] is not None
    assert row["role"] == "assistant" and row["run_id"] == "r9" and row["metadata"] == '{"k":"v"}'
    assert row["ts"].isoformat().startswith("2025-03-01T10:00:00")
    emb = emb_row(services.ch, ns, "c1", "m1")
    assert emb["is_saved"] is True and emb["saved_at"] == row["saved_at"] and emb["user_id"] == "alice"
    assert emb["text"] == "The invoices moved to the new ledger on Friday." and len(emb["embedding"]) == 384
    assert emb["model"] == FakeEmbedder().model_id
    # Recording stays off: an append is still not kept.
    assert namespaces.get(services.ch, ns).conversation_logging_enabled is False
    r = await ok(call, "conversation.append", token, namespace=ns, thread_id="c1", role="user", content="hi")
    assert r["stored"] is False and r["reason"] == "logging_disabled"


async def test_a_message_in_the_transcript_is_flagged_in_place(call, ns, writer, services):
    await _append(
        call, writer, ns, thread_id="c1", msg_id="m1", role="assistant", content="as recorded", run_id="run-1"
    )
    before = emb_row(services.ch, ns, "c1", "m1")
    assert before["is_saved"] is False
    body = await save(
        call,
        writer,
        namespace=ns,
        conversation_id="c1",
        message_id="m1",
        role="assistant",
        content="a client's different copy",
        run_id="run-2",
    )
    assert body["saved"] is True and body["indexed"] is True
    [row] = turn_rows(services.ch, ns)
    assert row["content"] == "as recorded" and row["run_id"] == "run-1"  # never re-labelled
    assert row["is_saved"] is True and row["user_id"] == "alice"
    after = emb_row(services.ch, ns, "c1", "m1")
    assert after["is_saved"] is True and after["saved_at"] == row["saved_at"] and after["user_id"] == "alice"
    assert after["text"] == "as recorded" and after["run_id"] == "run-1"
    assert np.allclose(after["embedding"], before["embedding"])  # the vector is kept, not redone
    assert body["saved_at"].startswith(row["saved_at"].isoformat()[:19])


async def test_saving_again_keeps_saved_at_and_writes_nothing_new(call, ns, token, services):
    first = await save(call, token, namespace=ns, content="remember the staging cluster password rotation")
    rows = len(_raw_rows(services, ns))
    again = await ok(call, SAVE, token, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert again == first
    assert len(_raw_rows(services, ns)) == rows


async def test_owner_mismatch(call, ns, writer, services):
    await _append(call, writer, ns, thread_id="c", msg_id="m", role="user", content="mine", user_id="alice")
    body = await ok(call, SAVE, writer, namespace=ns, user_id="bob", conversation_id="c", message_id="m")
    assert body == {
        "conversation_id": "c",
        "message_id": "m",
        "saved": False,
        "indexed": False,
        "reason": "owner_mismatch",
        "saved_at": None,
    }
    [row] = turn_rows(services.ch, ns)
    assert row["user_id"] == "alice" and row["is_saved"] is False
    # Also once alice saved it: bob learns nothing about it.
    await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    body = await ok(call, SAVE, writer, namespace=ns, user_id="bob", conversation_id="c", message_id="m")
    assert body["reason"] == "owner_mismatch" and body["saved"] is False and body["saved_at"] is None
    assert emb_row(services.ch, ns, "c", "m")["user_id"] == "alice"


async def test_deleted_also_once_saved(call, ns, writer, services):
    await _append(call, writer, ns, thread_id="c", msg_id="m", role="user", content="soon deleted")
    tombstone_turn(services.ch, ns, "default", "c", "m")
    body = await save(call, writer, namespace=ns, content="soon deleted")
    assert body["saved"] is False and body["reason"] == "deleted"
    # A saved one deleted afterwards answers the same.
    await _append(call, writer, ns, thread_id="c", msg_id="k", role="user", content="saved then deleted")
    assert (await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="k"))[
        "saved"
    ] is True
    tombstone_turn(services.ch, ns, "default", "c", "k")
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="k")
    assert body["saved"] is False and body["reason"] == "deleted"


async def test_unsupported_role(call, ns, writer, token, services, api_embedder):
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    await _append(call, writer, ns, thread_id="c", msg_id="sys", role="system", content="You are helpful.")
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="sys")
    assert body["saved"] is False and body["indexed"] is False and body["reason"] == "unsupported_role"
    assert turn_rows(services.ch, ns)[0]["is_saved"] is False
    # A new tool message is not stored.
    body = await save(
        call,
        token,
        namespace=ns,
        conversation_id="c2",
        message_id="tool1",
        role="tool",
        content='{"ok": true}',
    )
    assert body["reason"] == "unsupported_role" and body["saved"] is False
    assert [r["msg_id"] for r in turn_rows(services.ch, ns)] == ["sys"]
    assert spy.texts == []


async def test_high_sensitivity(call, ns, writer, services, api_embedder):
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    # A new message that reads as high is not stored.
    body = await save(call, writer, namespace=ns, message_id="new", content=HIGH)
    assert body == {
        "conversation_id": "c",
        "message_id": "new",
        "saved": False,
        "indexed": False,
        "reason": "high_sensitivity",
        "saved_at": None,
    }
    assert turn_rows(services.ch, ns) == []
    # An existing one is not embedded (nor flagged).
    await _append(call, writer, ns, thread_id="c", msg_id="old", role="user", content=HIGH)
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="old")
    assert body["reason"] == "high_sensitivity" and body["indexed"] is False and body["saved"] is False
    assert emb_rows(services.ch, ns) == []
    # One an earlier build flagged without the high mark: still refused, never embedded.
    await _append(call, writer, ns, thread_id="c", msg_id="legacy", role="user", content="plain for now")
    revise_turn(
        services.ch,
        ns,
        "default",
        "c",
        "legacy",
        content=f"'{HIGH}'",
        high_sensitivity="false",
        is_saved="true",
        saved_at="now64(3)",
        user_id="'alice'",
    )
    body = await ok(
        call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="legacy"
    )
    assert body["reason"] == "high_sensitivity" and body["saved"] is True and body["indexed"] is False
    assert not any("Tr0ub4dor" in t for t in spy.texts)


async def test_embed_failed_then_saving_again_retries(call, ns, token, services, api_embedder):
    failing = api_embedder(FakeEmbedder(fail=True))
    body = await save(call, token, namespace=ns, content="the ETL backfill window is three days")
    assert body["saved"] is True and body["indexed"] is False and body["reason"] == "embed_failed"
    assert len(failing.calls) == 1
    [row] = turn_rows(services.ch, ns)
    assert row["is_saved"] is True
    emb = emb_row(services.ch, ns, "c", "m")
    assert (
        emb["embedding"] == []
        and emb["error"].startswith("embedder_unavailable: ")
        and emb["is_saved"] is True
    )
    api_embedder(FakeEmbedder())
    body = await ok(call, SAVE, token, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body["saved"] is True and body["indexed"] is True and body["reason"] is None
    emb = emb_row(services.ch, ns, "c", "m")
    assert emb["error"] == "" and len(emb["embedding"]) == 384 and emb["is_saved"] is True
    assert len(turn_rows(services.ch, ns)) == 1


async def test_embedding_uses_the_first_2048_characters(call, ns, token, services, api_embedder):
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    long = "word " * 1000
    await save(call, token, namespace=ns, user_id="u", content=long)
    assert spy.texts == [long[:2048]]
    assert emb_row(services.ch, ns, "c", "m")["text"] == long[:2048]
    assert turn_rows(services.ch, ns)[0]["content"] == long


# -- ownership race and retries ----------------------------------------------------------


async def test_two_users_racing_for_one_unowned_message_50_times(call, ns, writer, services):
    turns = [
        {"thread_id": f"race{i}", "msg_id": "m", "role": "user", "content": f"unowned message {i}"}
        for i in range(50)
    ]
    r = await ok(call, "conversation.append", writer, namespace=ns, turns=turns)
    assert r["stored"] == 50
    for i in range(50):
        a, b = await asyncio.gather(
            ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id=f"race{i}", message_id="m"),
            ok(call, SAVE, writer, namespace=ns, user_id="bob", conversation_id=f"race{i}", message_id="m"),
        )
        assert sorted([a["saved"], b["saved"]]) == [False, True], (i, a, b)
        loser = a if not a["saved"] else b
        assert loser["reason"] == "owner_mismatch"
        winner = "alice" if a["saved"] else "bob"
        row = [x for x in turn_rows(services.ch, ns) if x["thread_id"] == f"race{i}"][0]
        assert row["user_id"] == winner and row["is_saved"] is True
        emb = emb_row(services.ch, ns, f"race{i}", "m")
        assert emb["user_id"] == winner and emb["is_saved"] is True


async def test_two_concurrent_saves_of_a_new_message_store_one_row(call, ns, token, services):
    body = dict(
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_id="m",
        role="user",
        content="the canary release goes out on Tuesday",
    )
    a, b = await asyncio.gather(ok(call, SAVE, token, **body), ok(call, SAVE, token, **body))
    assert a["saved"] and b["saved"] and a["saved_at"] == b["saved_at"]
    assert len(_raw_rows(services, ns)) == 1
    # Two users at once: one row, one owner.
    other = dict(body, message_id="m2")
    a, b = await asyncio.gather(
        ok(call, SAVE, token, **other), ok(call, SAVE, token, **dict(other, user_id="bob"))
    )
    assert sorted([a["saved"], b["saved"]]) == [False, True]
    assert len([r for r in _raw_rows(services, ns) if r["msg_id"] == "m2"]) == 1


async def test_dedup_token_holds_even_without_the_lease(ns, services, monkeypatch):
    """Should the lease fail to serialise two saves of a new message (it expired), the
    insert's deduplication token still stores one transcript row."""

    @contextlib.asynccontextmanager
    async def no_lease(*_: Any, **__: Any) -> AsyncIterator[None]:
        yield

    monkeypatch.setattr(saving, "thread_lease", no_lease)
    who = Principal("t", (ns,), Role.writer)
    new = alice_saves(ns, "c", role="user", content="concurrent without a lease")
    results = await asyncio.gather(*(saving.save_message(services, who, new) for _ in range(4)))
    assert all(r.saved for r in results)
    assert len(_raw_rows(services, ns)) == 1


async def test_a_save_repairs_a_missing_embedding_row(call, ns, writer, services):
    await _append(call, writer, ns, thread_id="c", msg_id="m", role="user", content="repair me")
    await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    # An interrupted save: the transcript row is flagged, the embedding row is gone.
    services.ch.command(
        "DELETE FROM conversation_embeddings WHERE namespace = {ns:String}", parameters={"ns": ns}
    )
    assert emb_row(services.ch, ns, "c", "m") is None
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body["saved"] is True and body["indexed"] is True
    emb = emb_row(services.ch, ns, "c", "m")
    assert emb["is_saved"] is True and emb["user_id"] == "alice" and len(emb["embedding"]) == 384


async def test_a_save_flags_rows_still_unflagged(call, ns, writer, services):
    await _append(call, writer, ns, thread_id="c", msg_id="m", role="user", content="half saved")
    # An interrupted save: the transcript row claimed and flagged, the embedding row not yet.
    revise_turn(services.ch, ns, "default", "c", "m", is_saved="true", saved_at="now64(3)", user_id="'alice'")
    assert emb_row(services.ch, ns, "c", "m")["is_saved"] is False
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body["saved"] is True and body["indexed"] is True
    emb = emb_row(services.ch, ns, "c", "m")
    row = turn_rows(services.ch, ns)[0]
    assert emb["is_saved"] is True and emb["saved_at"] == row["saved_at"] and emb["user_id"] == "alice"
    # The other way round: the transcript row lost its flag, the embedding row kept it.
    revise_turn(services.ch, ns, "default", "c", "m", is_saved="false")
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body["saved"] is True
    assert turn_rows(services.ch, ns)[0]["is_saved"] is True


async def test_an_append_whose_embedding_lands_after_a_save_flags_its_own_row(
    ns, writer, services, worker_embedder
):
    worker_embedder(FakeEmbedder(delay_seconds=0.8))
    who = Principal("t", (ns,), Role.writer)
    task = asyncio.create_task(
        append(services, who, ns, "default", [turn("t", "user", "late vector", msg_id="m")])
    )

    async def landed() -> bool:
        return len(turn_rows(services.ch, ns)) == 1

    assert await wait_for(landed, timeout=5)
    saved = await saving.save_message(services, who, alice_saves(ns, "t"))
    assert saved.saved and saved.indexed
    [res] = await task
    assert res.stored is True and res.embedding == "embedded"
    emb = emb_row(services.ch, ns, "t", "m")
    assert emb["is_saved"] is True and emb["user_id"] == "alice" and emb["saved_at"] is not None
    assert len(emb["embedding"]) == 384


async def test_an_append_racing_a_new_save_answers_duplicate(ns, writer, services):
    who = Principal("t", (ns,), Role.writer)
    saved, [appended] = await asyncio.gather(
        saving.save_message(services, who, alice_saves(ns, "t", role="user", content="same turn, two paths")),
        append(services, who, ns, "default", [turn("t", "user", "same turn, two paths", msg_id="m")]),
    )
    assert saved.saved is True
    [row] = turn_rows(services.ch, ns)
    assert row["is_saved"] is True and row["user_id"] == "alice"
    # Either the append landed first and the save flagged its row in place, or the
    # save's row landed first and the append found it there.
    assert appended.stored or appended.reason == "duplicate"


# -- unsave ------------------------------------------------------------------------------


async def test_unsave_where_the_namespace_does_not_record_removes_the_turn(call, ns, token, services):
    await save(call, token, namespace=ns, content="only here because of the save")
    body = await ok(call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body == {"found": True, "removed": True}
    assert _raw_rows(services, ns) == []
    emb = emb_row(services.ch, ns, "c", "m")
    assert (
        emb["tombstoned"] is True
        and emb["is_saved"] is False
        and emb["embedding"] == []
        and emb["text"] == ""
    )
    # Its text is gone from the per-user indexes too.
    for table in ("saved_docs", "saved_terms"):
        left = services.ch.query(
            f"SELECT count() FROM {table} WHERE namespace = {{ns:String}}", parameters={"ns": ns}
        )
        assert left.result_rows[0][0] == 0, table
    # Idempotent.
    assert await ok(
        call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c", message_id="m"
    ) == {"found": False, "removed": False}
    # Saving again restores it (a new generation: the first insert's token does not swallow it).
    body = await save(call, token, namespace=ns, content="only here because of the save")
    assert body["saved"] is True and body["indexed"] is True
    assert len(turn_rows(services.ch, ns)) == 1
    emb = emb_row(services.ch, ns, "c", "m")
    assert emb["tombstoned"] is False and emb["is_saved"] is True and len(emb["embedding"]) == 384


async def test_unsave_where_the_namespace_records_keeps_the_turn(call, ns, writer, services):
    await _append(call, writer, ns, thread_id="c", msg_id="m", role="user", content="recorded and saved")
    await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    body = await ok(call, UNSAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body == {"found": True, "removed": False}
    [row] = turn_rows(services.ch, ns)
    assert row["is_saved"] is False and row["content"] == "recorded and saved" and not row["tombstoned"]
    emb = emb_row(services.ch, ns, "c", "m")
    assert emb["is_saved"] is False and emb["tombstoned"] is False and len(emb["embedding"]) == 384
    assert await ok(
        call, UNSAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m"
    ) == {"found": False, "removed": False}
    body = await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    assert body["saved"] is True and body["indexed"] is True
    assert emb_row(services.ch, ns, "c", "m")["is_saved"] is True


async def test_unsave_never_says_whose(call, ns, writer, services):
    await _append(
        call, writer, ns, thread_id="c", msg_id="mine", role="user", content="alice's", user_id="alice"
    )
    await _append(call, writer, ns, thread_id="c", msg_id="unsaved", role="user", content="nobody saved this")
    await ok(call, SAVE, writer, namespace=ns, user_id="alice", conversation_id="c", message_id="mine")
    for msg in ("mine", "unsaved", "absent"):
        body = await ok(
            call, UNSAVE, writer, namespace=ns, user_id="bob", conversation_id="c", message_id=msg
        )
        assert body == {"found": False, "removed": False}, msg
    row = [r for r in turn_rows(services.ch, ns) if r["msg_id"] == "mine"][0]
    assert row["is_saved"] is True and row["user_id"] == "alice"


async def test_a_tombstone_keeps_an_older_version_from_coming_back(call, ns, token, services):
    await save(call, token, namespace=ns, content="withdrawn")
    old = emb_row(services.ch, ns, "c", "m")
    await ok(call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c", message_id="m")
    # A merge or a late replica brings the old version back into the same table: the
    # tombstone's newer version still wins.
    services.ch.command("OPTIMIZE TABLE conversation_embeddings FINAL")
    newest = emb_row(services.ch, ns, "c", "m")
    assert newest["tombstoned"] is True and newest["version"] > old["version"]


# -- tokens pinned to one user, and bad input -------------------------------------------------


async def test_own_user_token_acts_as_its_user(call, ns, mint, services):
    pinned = mint(ns, "writer", read_scope="own_user", read_user_id="carol")
    body = await save(call, pinned, namespace="@me", user_id=None, content="carol's note")
    assert body["saved"] is True
    assert turn_rows(services.ch, ns)[0]["user_id"] == "carol"
    body = await ok(call, SAVE, pinned, namespace=ns, user_id="carol", conversation_id="c", message_id="m")
    assert body["saved"] is True
    r = await call(
        SAVE,
        pinned,
        namespace=ns,
        user_id="dave",
        conversation_id="c",
        message_id="m2",
        role="user",
        content="not allowed",
    )
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    r = await call(UNSAVE, pinned, namespace="@me", user_id="dave", conversation_id="c", message_id="m")
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    assert len(turn_rows(services.ch, ns)) == 1
    assert await ok(call, UNSAVE, pinned, namespace="@me", conversation_id="c", message_id="m") == {
        "found": True,
        "removed": True,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"conversation_id": "c", "message_id": "m", "role": "user", "content": "x"}, "user_id"),
        ({"user_id": "u", "conversation_id": "c", "message_id": "m"}, "content"),
        ({"user_id": "u", "conversation_id": "c", "message_id": "m", "role": "user"}, "content"),
        ({"user_id": "u", "conversation_id": "c", "message_id": "m", "content": "x"}, "role"),
        (
            {"user_id": "u", "conversation_id": "c", "message_id": "m", "role": "user", "content": "  "},
            "content",
        ),
        (
            {"user_id": "u", "conversation_id": "c", "message_id": "m", "role": "robot", "content": "x"},
            "role",
        ),
        (
            {"user_id": "", "conversation_id": "c", "message_id": "m", "role": "user", "content": "x"},
            "user_id",
        ),
        (
            {"user_id": "u", "conversation_id": "", "message_id": "m", "role": "user", "content": "x"},
            "conversation_id",
        ),
        (
            {
                "user_id": "u",
                "conversation_id": "c",
                "message_id": "m",
                "role": "user",
                "content": "x",
                "extra": 1,
            },
            "extra",
        ),
        (
            {
                "user_id": "u",
                "conversation_id": "c",
                "message_id": "m",
                "role": "user",
                "content": "x",
                "ts": "soon",
            },
            "ts",
        ),
        (
            {
                "user_id": "u",
                "conversation_id": "c",
                "message_id": "m",
                "role": "user",
                "content": "x",
                "agent": "bad agent",
            },
            "agent",
        ),
    ],
)
async def test_bad_input_is_a_4xx_naming_the_field_and_writes_nothing(call, ns, token, services, body, field):
    r = await call(SAVE, token, namespace=ns, **body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()
    assert err["error"] == "invalid_request" and err["field"] == field and err["rule"], err
    assert _raw_rows(services, ns) == [] and emb_rows(services.ch, ns) == []
