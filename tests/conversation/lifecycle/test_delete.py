"""conversation.delete: confirmation, tombstones, the shared-row hand-over, the
240-character rule, rows left behind or expired, and races with append, save and an
in-flight embedding."""

from __future__ import annotations

import asyncio

from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.ops.conversation import append
from loom.ops.conversation.lifecycle.deleting import delete
from loom.providers.embedders import FakeEmbedder
from loom.store import embeddings as emb_store
from tests.conversation.helpers import (
    append_turn,
    emb_row,
    emb_rows,
    ok,
    raise_marks,
    tombstone_turn,
    turn,
    turn_rows,
)


def _live(rows):
    return [r for r in rows if not r["tombstoned"]]


async def test_confirm_must_repeat_the_thread_id_else_422_and_nothing_written(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    await append_turn(call, writer, ns, "a", "t1", "user", "keep me please")
    r = await call(
        "conversation.delete", admin, namespace=ns, agent="a", thread_id="t1", confirm_thread_id="t2"
    )
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "confirm_thread_id"
    assert len(_live(turn_rows(services.ch, ns))) == 1
    assert _live(emb_rows(services.ch, ns))
    # A writer may not delete at all.
    r = await call(
        "conversation.delete", writer, namespace=ns, agent="a", thread_id="t1", confirm_thread_id="t1"
    )
    assert r.status_code == 403


async def test_delete_tombstones_turns_thread_and_embeddings_and_every_read_drops_them(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    await append_turn(call, writer, ns, "a", "t1", "user", "the staging deploy rolled back at noon")
    await append_turn(
        call, writer, ns, "a", "t1", "assistant", "because the migration locked the ledger table"
    )
    await append_turn(call, writer, ns, "a", "t1", "tool", "exit 1")
    await append_turn(call, writer, ns, "a", "t2", "user", "another thread stays")
    got = await ok(
        call, "conversation.delete", admin, namespace=ns, agent="a", thread_id="t1", confirm_thread_id="t1"
    )
    assert got["deleted"] and got["turns_tombstoned"] == 3 and got["thread_tombstoned"]
    assert got["embeddings_tombstoned"] == 2 and got["embeddings_handed_over"] == 0
    rows = {r["msg_id"]: r for r in turn_rows(services.ch, ns) if r["thread_id"] == "t1"}
    assert all(r["tombstoned"] and r["tombstone_reason"] == "deleted" for r in rows.values())
    assert [e["thread_id"] for e in _live(emb_rows(services.ch, ns))] == ["t2"]
    r = await call("conversation.get", writer, namespace=ns, agent="a", thread_id="t1", include_messages=True)
    assert r.status_code == 404
    listed = await ok(call, "conversation.list", writer, namespace=ns, agent="a", thread_id="t1")
    assert listed["messages"] == []
    threads = await ok(call, "conversation.threads", writer, namespace=ns, agent="a")
    assert [t["thread_id"] for t in threads["threads"]] == ["t2"]
    hits = await ok(call, "conversation.search", writer, query="staging deploy rolled back ledger migration")
    assert all(h["thread_id"] != "t1" for h in hits["hits"])
    # Idempotent: a second delete finds nothing left.
    again = await ok(
        call, "conversation.delete", admin, namespace=ns, agent="a", thread_id="t1", confirm_thread_id="t1"
    )
    assert not again["deleted"] and again["turns_tombstoned"] == 0


async def test_a_shared_embedding_row_passes_to_the_other_agents_live_copy(call, ns, writer, mint, services):
    admin = mint(ns, "admin")
    text = "we moved invoices to the new ledger"
    first = await append_turn(call, writer, ns, "a", "t", "user", text, run_id="ra", user_id="ua")
    await append_turn(call, writer, ns, "b", "t", "user", text, run_id="rb", user_id="ub")
    msg = first["msg_id"]
    assert emb_row(services.ch, ns, "t", msg)["agent"] == "a"
    got = await ok(
        call, "conversation.delete", admin, namespace=ns, agent="a", thread_id="t", confirm_thread_id="t"
    )
    assert got["embeddings_handed_over"] == 1 and got["embeddings_tombstoned"] == 0
    row = emb_row(services.ch, ns, "t", msg)
    assert (row["agent"], row["role"], row["run_id"], row["user_id"], row["tombstoned"]) == (
        "b",
        "user",
        "rb",
        "ub",
        False,
    )
    hits = await ok(call, "conversation.search", writer, query=text)
    assert [(h["agent"], h["msg_id"]) for h in hits["hits"]][:1] == [("b", msg)]


def _write_turn(ch, ns, agent, thread, msg, content, *, role="user"):
    from datetime import UTC, datetime

    from loom.store import conversations as conv_store

    conv_store.insert(
        ch,
        [
            conv_store.Turn(
                namespace=ns,
                agent=agent,
                thread_id=thread,
                msg_id=msg,
                ts=datetime.now(UTC),
                role=role,
                content=content,
                version=next_version(),
            )
        ],
    )


def _write_emb(ch, ns, agent, thread, msg, text):
    from datetime import UTC, datetime

    emb_store.insert(
        ch,
        [
            emb_store.EmbeddingRow(
                namespace=ns,
                thread_id=thread,
                msg_id=msg,
                agent=agent,
                role="user",
                run_id="",
                user_id="",
                ts=datetime.now(UTC),
                text=text,
                embedding=FakeEmbedder().embed([text])[0],
                model="fake",
                version=next_version(),
            )
        ],
    )


async def test_a_240_character_row_passes_only_to_a_copy_matching_its_agents_turn(ns, services):
    """m1: an earlier build's 240-character cut of a long turn, both copies alike: passes.
    m2: the other copy differs past 240 characters: tombstoned. m3: the row's agent's
    message row is gone (nothing to check against): tombstoned. m4: a whole turn of 240
    characters with the same text: passes."""
    ch = services.ch
    long_a = "x" * 240 + " and the rest of a long answer " * 20
    raise_marks(ch, ns, "t")
    for msg, a_text, b_text in (
        ("m1", long_a, long_a),
        ("m2", long_a, "x" * 240 + " a different tail"),
        ("m3", long_a, long_a),
        ("m4", "y" * 240, "y" * 240),
    ):
        _write_turn(ch, ns, "a", "t", msg, a_text)
        _write_turn(ch, ns, "b", "t", msg, b_text)
        _write_emb(ch, ns, "a", "t", msg, a_text[:240])
    ch.command(
        "DELETE FROM conversations WHERE namespace = {ns:String} AND agent = 'a' AND msg_id = 'm3'",
        parameters={"ns": ns},
    )
    got = await delete(services, Principal("t", (ns,), Role.admin), ns, "a", "t", "t")
    rows = {r["msg_id"]: r for r in emb_rows(ch, ns)}
    assert (rows["m1"]["agent"], rows["m1"]["tombstoned"]) == ("b", False)
    assert rows["m2"]["tombstoned"] and rows["m2"]["text"] == "" and list(rows["m2"]["embedding"]) == []
    assert rows["m3"]["tombstoned"]
    assert (rows["m4"]["agent"], rows["m4"]["tombstoned"]) == ("b", False)
    assert (got.embeddings_handed_over, got.embeddings_tombstoned) == (2, 2)


async def test_delete_finishes_rows_left_behind_and_rows_whose_message_expired(ns, services):
    """Rows of the thread whose own agent holds no live message: c's turn was compacted
    by an earlier build (row left live), d's message the TTL removed (row left live; b
    holds a live copy of the same text). a's delete finishes both."""
    ch = services.ch
    raise_marks(ch, ns, "t")
    _write_turn(ch, ns, "a", "t", "own", "a's own turn")
    _write_emb(ch, ns, "a", "t", "own", "a's own turn")
    _write_turn(ch, ns, "c", "t", "left", "compacted long ago")
    _write_emb(ch, ns, "c", "t", "left", "compacted long ago")
    tombstone_turn(ch, ns, "c", "t", "left", reason="compacted")
    _write_turn(ch, ns, "d", "t", "expired", "the same words twice")
    _write_turn(ch, ns, "b", "t", "expired", "the same words twice")
    _write_emb(ch, ns, "d", "t", "expired", "the same words twice")
    ch.command(
        "DELETE FROM conversations WHERE namespace = {ns:String} AND agent = 'd'", parameters={"ns": ns}
    )
    _write_turn(ch, ns, "e", "t", "alive", "e's live turn")
    _write_emb(ch, ns, "e", "t", "alive", "e's live turn")
    got = await delete(services, Principal("t", (ns,), Role.admin), ns, "a", "t", "t")
    rows = {r["msg_id"]: r for r in emb_rows(ch, ns)}
    assert rows["own"]["tombstoned"] and rows["left"]["tombstoned"]
    assert (rows["expired"]["agent"], rows["expired"]["tombstoned"]) == ("b", False)
    assert (rows["alive"]["agent"], rows["alive"]["tombstoned"]) == ("e", False)  # served by a live copy
    assert (got.embeddings_tombstoned, got.embeddings_handed_over) == (2, 1)


async def test_a_delete_racing_appends_and_an_inflight_embedding_leaves_no_live_row(
    ns, writer, services, worker_embedder, other_services
):
    """Appends stamped before the delete began (some landed, some still in their flush
    window, their embeddings in flight on a slow model) end tombstoned, with no vector;
    those whose embedding was in flight answer deleted."""
    worker_embedder(FakeEmbedder(delay_seconds=0.5))
    writer_who = Principal("w", (ns,), Role.writer)
    admin = Principal("x", (ns,), Role.admin)
    first = await append(services, writer_who, ns, "a", [turn("t", "user", "landed first", msg_id="m0")])
    assert first[0].stored
    # A second API process whose flush window is long: its rows land after the delete read.
    slow = other_services(
        write_batch_embed_wait_ms=300.0, write_batch_max_wait_ms=300.0, write_batch_embed_quiet_ms=0
    )
    tasks = [
        asyncio.create_task(
            append(services, writer_who, ns, "a", [turn("t", "user", "in flight", msg_id="m1")])
        ),
        asyncio.create_task(
            append(
                slow,
                writer_who,
                ns,
                "a",
                [
                    turn("t", "user", "late row", msg_id="m2"),
                    turn("t", "tool", "late tool", msg_id="m3"),
                ],
            )
        ),
    ]
    await asyncio.sleep(0.1)  # stamped, m1 landed and embedding; m2/m3 still in their window
    got = await delete(services, admin, ns, "a", "t", "t")
    assert got.deleted
    answers = [r for t in tasks for r in await t]
    from loom.ops.conversation import close_pipeline

    await close_pipeline(slow)
    by_msg = {r.msg_id: r for r in answers}
    assert by_msg["m1"].reason == "deleted" and by_msg["m1"].embedding == "skipped:deleted"
    assert by_msg["m2"].stored is False and by_msg["m2"].reason == "deleted"
    assert by_msg["m3"].stored is False and by_msg["m3"].reason == "deleted"
    await asyncio.sleep(0.8)  # any late vector would have landed by now
    assert _live(turn_rows(services.ch, ns)) == []
    assert _live(emb_rows(services.ch, ns)) == []
    # An append after the delete is a new turn of the thread.
    after = await append(services, writer_who, ns, "a", [turn("t", "tool", "after the delete", msg_id="m9")])
    assert after[0].stored


async def test_a_save_after_the_delete_answers_deleted(call, ns, writer, mint, services):
    admin = mint(ns, "admin")
    got = await append_turn(call, writer, ns, "default", "t", "user", "save me later", user_id="u1")
    await ok(call, "conversation.delete", admin, namespace=ns, thread_id="t", confirm_thread_id="t")
    saved = await ok(
        call,
        "conversation.save_message",
        writer,
        namespace=ns,
        user_id="u1",
        conversation_id="t",
        message_id=got["msg_id"],
    )
    assert saved["saved"] is False and saved["reason"] == "deleted"
