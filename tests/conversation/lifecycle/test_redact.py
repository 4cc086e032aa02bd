"""conversation.delete_message and conversation.redact: after either, the removed text is
readable through no op and is absent from every table's rows on disk (every table of
the database, every version, no FINAL); shared embedding rows pass to another agent's
copy; saved and compacted turns; receipts; the role matrix; idempotency; erasure.export
shows redactions as such."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import pytest

from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.ops.conversation.lifecycle.deleting_message import delete_message
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import evidence as evidence_store
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import append_turn, emb_row, ok, raise_marks, turn_rows

SECRET = "zqx-purple-otter-4471"  # one token: the saved and evidence postings hold it as a term
P = ParamSpec("P")
T = TypeVar("T")
KEY = "sk-proj-" + "Q7wErT9yUiOp3aSdF5gHjK1lZxCvBnM8qWe2"  # reads as high


def tables_holding(ch: Any, text: str) -> dict[str, int]:
    """Every table of the test database whose rows (every version, no FINAL) hold `text`
    in any string column: table -> rows."""
    cols = ch.query(
        "SELECT c.table, c.name, c.type FROM system.columns AS c INNER JOIN system.tables AS t "
        "ON c.database = t.database AND c.table = t.name WHERE c.database = currentDatabase() "
        "AND t.engine NOT IN ('MaterializedView', 'View', 'Null') AND c.type LIKE '%String%' "
        "AND c.type NOT LIKE '%Map%' AND c.type NOT LIKE '%Tuple%'"
    ).result_rows
    by_table: dict[str, list[str]] = {}
    for table, name, typ in cols:
        expr = (
            f"arrayExists(x -> position(toString(x), {{s:String}}) > 0, `{name}`)"
            if typ.startswith("Array")
            else f"position(toString(`{name}`), {{s:String}}) > 0"
        )
        by_table.setdefault(table, []).append(expr)
    found = {}
    for table, exprs in by_table.items():
        n = ch.query(
            # every row in the part files: rows a lightweight DELETE only hid count too
            f"SELECT count() FROM `{table}` WHERE {' OR '.join(exprs)} SETTINGS apply_deleted_mask = 0",
            parameters={"s": text},
        ).result_rows[0][0]
        if n:
            found[table] = int(n)
    return found


async def _embedded(ch, ns, thread, msg):
    async def ready():
        row = emb_row(ch, ns, thread, msg)
        return row is not None and len(row["embedding"]) > 0

    assert await wait_for(ready), "the turn was never embedded"


def _evidence(ch, ns, user, msg, content):
    evidence_store.insert(
        ch,
        [
            evidence_store.Evidence(
                namespace=ns,
                user_id=user,
                evidence_id=f"ev-{msg}",
                session_id="",
                run_id="",
                source="messages",
                msg_id=msg,
                role="user",
                content=content,
                high_sensitivity=False,
                ts=datetime.now(UTC),
                created_at=datetime.now(UTC),
                version=next_version(),
            )
        ],
    )


async def _readable_anywhere(call, ns, admin, user, thread, text) -> list[str]:
    """The ops through which `text` can still be read."""
    seen = []
    got = await call(
        "conversation.get", admin, namespace=ns, agent="a", thread_id=thread, include_messages=True
    )
    if text in got.text:
        seen.append("get")
    listed = await call("conversation.list", admin, namespace=ns, agent="a", thread_id=thread)
    if text in listed.text:
        seen.append("list")
    hits = await call("conversation.search", admin, query=text)
    if text in hits.text:
        seen.append("search")
    saved = await call("conversation.list_saved_messages", admin, namespace=ns, user_id=user)
    if text in saved.text:
        seen.append("list_saved")
    found = await call(
        "conversation.search_saved_messages",
        admin,
        namespace=ns,
        user_id=user,
        query=text,
        search_mode="lexical",
    )
    if text in found.text:
        seen.append("search_saved")
    recall = await call("memory.recall", admin, namespace=ns, user_id=user, query=text)
    if text in recall.text:
        seen.append("recall")
    export = await call("erasure.export", admin, user_id=user, namespaces=[ns])
    if text in export.text:
        seen.append("export")
    return seen


async def _seed(call, ns, writer, services, thread="t"):
    """Three turns of agent a, the middle one holding SECRET, saved for u1, with memory
    evidence of it; returns its msg_id."""
    await append_turn(call, writer, ns, "a", thread, "user", "we plan the ferry trip", user_id="u1")
    got = await append_turn(
        call, writer, ns, "a", thread, "user", f"remember {SECRET} for the ferry trip", user_id="u1"
    )
    msg = got["msg_id"]
    await append_turn(call, writer, ns, "a", thread, "assistant", "noted, the ferry leaves at nine")
    await _embedded(services.ch, ns, thread, msg)
    await ok(
        call,
        "conversation.save_message",
        writer,
        namespace=ns,
        agent="a",
        user_id="u1",
        conversation_id=thread,
        message_id=msg,
    )
    _evidence(services.ch, ns, "u1", msg, f"remember {SECRET} for the ferry trip")
    return msg


async def test_delete_message_leaves_the_text_nowhere_readable_nor_on_disk_with_a_receipt(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    msg = await _seed(call, ns, writer, services)
    held = tables_holding(services.ch, SECRET)
    for table in ("conversations", "conversation_embeddings", "saved_docs", "saved_terms", "memory_evidence"):
        assert table in held, held  # the test can fail: the text was there
    assert "search" in await _readable_anywhere(call, ns, admin, "u1", "t", SECRET)

    got = await ok(
        call, "conversation.delete_message", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg
    )
    assert got["deleted"] and got["found"] and got["by"] and got["at"]
    assert 0 < got["unreadable_ms"] <= got["gone_ms"]
    assert got["embedding"] == "tombstoned"
    assert got["tables"]["conversations"]["written"] == 1 and got["tables"]["conversations"]["removed"] >= 1
    assert got["tables"]["conversation_embeddings"]["removed"] >= 1
    assert got["tables"]["saved_docs"]["removed"] >= 1 and got["tables"]["saved_terms"]["removed"] >= 1
    assert got["tables"]["memory_evidence"]["written"] == 1
    assert SECRET not in json.dumps(got)
    assert tables_holding(services.ch, SECRET) == {}
    assert await _readable_anywhere(call, ns, admin, "u1", "t", SECRET) == []
    # The thread's other turns are untouched.
    live = [r for r in turn_rows(services.ch, ns) if not r["tombstoned"]]
    assert [r["content"] for r in live] == ["we plan the ferry trip", "noted, the ferry leaves at nine"]
    # erasure.export shows the removal as such.
    export = await call("erasure.export", admin, user_id="u1", namespaces=[ns])
    lines = [json.loads(x) for x in export.text.splitlines()]
    rec = [x for x in lines if x["kind"] == "redaction"]
    assert [(r["msg_id"], r["action"]) for r in rec] == [(msg, "deleted")]
    # Idempotent: asked again, nothing left to do.
    again = await ok(
        call, "conversation.delete_message", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg
    )
    assert (again["found"], again["deleted"], again["tables"]) == (False, False, {})
    r = await call(
        "conversation.delete_message", admin, namespace=ns, agent="a", thread_id="t", msg_id="nope"
    )
    assert r.status_code == 404 and r.json()["field"] == "msg_id"


class _MergingServices(Services):
    """Services whose transcript writes are each followed by the engine's merge of the
    saved index and the transcript: the worst moment for it, a removal's older versions
    collapsed into its new ones before they are counted."""

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        out = await super().run(fn, *args, **kwargs)
        if fn is conv_store.insert:
            for table in ("saved_docs", "conversations"):
                await super().run(self.ch.command, f"OPTIMIZE TABLE {table} FINAL")
        return out


async def test_a_receipt_counts_the_older_rows_a_merge_takes_before_the_removal(call, ns, writer, services):
    msg = await _seed(call, ns, writer, services)
    assert "saved_docs" in tables_holding(services.ch, SECRET)
    merging = _MergingServices(
        **{f.name: getattr(services, f.name) for f in dataclasses.fields(Services) if f.init}
    )
    admin = Principal("x", (ns,), Role.admin)
    got = await delete_message(merging, admin, ns, "a", "t", msg)
    assert got.done and got.removal == "done"
    # Both held the text in an older version; the merge, not the op, took it off.
    assert got.tables["saved_docs"].removed >= 1
    assert got.tables["conversations"].removed >= 1
    assert tables_holding(services.ch, SECRET) == {}


async def test_delete_message_passes_a_shared_row_to_the_other_agents_copy(call, ns, writer, mint, services):
    admin = mint(ns, "admin")
    text = "we moved invoices to the new ledger"
    first = await append_turn(call, writer, ns, "a", "t", "user", text, run_id="ra", user_id="ua")
    msg = first["msg_id"]
    await _embedded(services.ch, ns, "t", msg)
    await append_turn(call, writer, ns, "b", "t", "user", text, run_id="rb", user_id="ub")
    assert emb_row(services.ch, ns, "t", msg)["agent"] == "a"
    got = await ok(
        call, "conversation.delete_message", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg
    )
    assert got["embedding"] == "handed_over"
    row = emb_row(services.ch, ns, "t", msg)
    assert (row["agent"], row["run_id"], row["user_id"], row["tombstoned"]) == ("b", "rb", "ub", False)
    hits = await ok(call, "conversation.search", writer, query=text)
    assert [(h["agent"], h["msg_id"]) for h in hits["hits"]][:1] == [("b", msg)]
    # No older version naming agent a is left.
    left = services.ch.query(
        "SELECT count() FROM conversation_embeddings WHERE namespace = {ns:String} AND agent = 'a'",
        parameters={"ns": ns},
    ).result_rows[0][0]
    assert left == 0


async def test_delete_message_role_matrix(call, ns, writer, mint, services):
    other_writer, viewer = mint(ns, "writer"), mint(ns, "viewer")
    alice = mint(ns, "writer", read_scope="own_user", read_user_id="alice")
    mine = (await append_turn(call, writer, ns, "a", "t", "user", "first note", user_id="alice"))["msg_id"]
    theirs = (await append_turn(call, writer, ns, "a", "t", "user", "second note", user_id="bob"))["msg_id"]
    body = {"namespace": ns, "agent": "a", "thread_id": "t"}
    r = await call("conversation.delete_message", viewer, msg_id=mine, **body)
    assert r.status_code == 403 and r.json()["rule"] == "role"
    r = await call("conversation.delete_message", other_writer, msg_id=mine, **body)
    assert r.status_code == 403 and r.json()["rule"] == "appended_by"
    # An end-user token: only its own user's saved messages.
    for m, user in ((mine, "alice"), (theirs, "bob")):
        await ok(
            call,
            "conversation.save_message",
            writer,
            namespace=ns,
            agent="a",
            user_id=user,
            conversation_id="t",
            message_id=m,
        )
    # An end-user token never removes a recorded turn. Another user's message: found
    # false, nothing said of it, nothing written.
    got = await ok(call, "conversation.delete_message", alice, msg_id=theirs, **{**body, "namespace": "@me"})
    assert (got["found"], got["deleted"], got["unsaved"]) == (False, False, False)
    live = [x for x in turn_rows(services.ch, ns) if not x["tombstoned"]]
    assert len(live) == 2 and all(x["is_saved"] for x in live)
    # Its own saved message: unsaved, as conversation.unsave_message does; the recorded
    # turn stays in the owner's transcript with the flag cleared.
    got = await ok(call, "conversation.delete_message", alice, msg_id=mine, **{**body, "namespace": "@me"})
    assert (got["found"], got["deleted"], got["unsaved"]) == (True, False, True)
    kept = {x["msg_id"]: x for x in turn_rows(services.ch, ns) if not x["tombstoned"]}
    assert (
        set(kept) == {mine, theirs} and not kept[mine]["is_saved"] and kept[mine]["content"] == "first note"
    )
    listed = await ok(call, "conversation.list_saved_messages", alice, namespace="@me")
    assert listed["messages"] == []
    # The writer whose token appended it may delete it.
    got = await ok(call, "conversation.delete_message", writer, msg_id=theirs, **body)
    assert got["deleted"]
    assert [x["msg_id"] for x in turn_rows(services.ch, ns) if not x["tombstoned"]] == [mine]


async def test_redact_high_replaces_the_secret_reembeds_and_export_shows_the_redaction(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    content = f"my deploy key is {KEY} please keep it for the ferry booking"
    got = await append_turn(call, writer, ns, "a", "t", "user", content, user_id="u1")
    msg = got["msg_id"]
    await append_turn(call, writer, ns, "a", "t", "assistant", "understood")
    row = [r for r in turn_rows(services.ch, ns) if r["msg_id"] == msg][0]
    assert row["high_sensitivity"] and emb_row(services.ch, ns, "t", msg) is None
    assert "conversations" in tables_holding(services.ch, KEY)

    red = await ok(
        call, "conversation.redact", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg, high=True
    )
    assert red["redacted"] and red["spans"] == 1 and red["placeholder"] == "[redacted]"
    assert not red["high_sensitivity"] and red["embedding"] == "embedded"
    assert red["tables"]["conversations"]["removed"] >= 1
    assert KEY not in json.dumps(red)
    assert tables_holding(services.ch, KEY) == {}
    row = [r for r in turn_rows(services.ch, ns) if r["msg_id"] == msg][0]
    assert row["content"] == "my deploy key is [redacted] please keep it for the ferry booking"
    assert not row["high_sensitivity"] and not row["tombstoned"]
    emb = emb_row(services.ch, ns, "t", msg)
    assert emb["text"] == row["content"] and len(emb["embedding"]) > 0
    hits = await ok(call, "conversation.search", admin, query="deploy key for the ferry booking")
    assert msg in [h["msg_id"] for h in hits["hits"]]
    assert await _readable_anywhere(call, ns, admin, "u1", "t", KEY) == []
    export = await call("erasure.export", admin, user_id="u1", namespaces=[ns])
    rec = [json.loads(x) for x in export.text.splitlines() if '"redaction"' in x]
    assert len(rec) == 1 and rec[0]["placeholder"] == "[redacted]" and rec[0]["spans"] == 1
    assert rec[0]["action"] == "redacted" and rec[0]["token_id"] and rec[0]["redacted_at"]
    # Asked again: nothing reads as high any more, nothing to do.
    again = await ok(
        call, "conversation.redact", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg, high=True
    )
    assert not again["redacted"] and again["tables"] == {}


async def test_redact_by_text_and_range_reaches_saved_index_evidence_and_title(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    msg = await _seed(call, ns, writer, services)
    services.ch.command(
        "INSERT INTO threads (namespace, agent, thread_id, title, metadata, run_id, created_at, version) "
        "VALUES ({ns:String}, 'a', 't', {title:String}, '{}', '', now64(6), {v:UInt64})",
        parameters={"ns": ns, "title": f"Ferry and {SECRET}", "v": next_version()},
    )
    red = await ok(
        call,
        "conversation.redact",
        admin,
        namespace=ns,
        agent="a",
        thread_id="t",
        msg_id=msg,
        spans=[SECRET],
        ranges=[[0, 8]],
        placeholder="[gone]",
    )
    assert red["redacted"] and red["spans"] == 2 and red["embedding"] == "embedded"
    assert red["tables"]["saved_terms"]["removed"] >= 1 and red["tables"]["memory_evidence"]["written"] == 1
    assert red["tables"]["threads"]["written"] == 1
    assert tables_holding(services.ch, SECRET) == {}
    assert await _readable_anywhere(call, ns, admin, "u1", "t", SECRET) == []
    row = [r for r in turn_rows(services.ch, ns) if r["msg_id"] == msg][0]
    assert row["content"] == "[gone] [gone] for the ferry trip" and row["is_saved"]
    # The saved index serves the new text.
    found = await ok(
        call,
        "conversation.search_saved_messages",
        admin,
        namespace=ns,
        user_id="u1",
        query="ferry trip",
        search_mode="lexical",
    )
    assert [h["message_id"] for h in found["hits"]] == [msg]
    thread = await ok(call, "conversation.get", admin, namespace=ns, agent="a", thread_id="t")
    assert thread["thread"]["title"] == "Ferry and [gone]"


@pytest.mark.parametrize("op", ["conversation.redact", "conversation.delete_message"])
async def test_a_compacted_turn_s_summary_is_tombstoned_and_the_turns_come_back(
    op, call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    ch = services.ch
    a = (await append_turn(call, writer, ns, "a", "t", "user", "we plan the ferry trip"))["msg_id"]
    b = (await append_turn(call, writer, ns, "a", "t", "user", f"remember {SECRET} for the trip"))["msg_id"]
    await _embedded(ch, ns, "t", b)
    # A compaction's outcome: a summary built from both turns (holding the secret), the
    # turns tombstoned (reason compacted).
    turns = {r["msg_id"]: r for r in turn_rows(ch, ns)}
    v = next_version()
    summary = conv_store.Turn(
        namespace=ns,
        agent="a",
        thread_id="t",
        msg_id="sum-1",
        ts=turns[a]["ts"],
        role="system",
        content=f"The user plans a ferry trip and keeps {SECRET}.",
        is_summary=True,
        metadata={"compacted_from": [a, b]},
        version=v,
    )
    tombs = []
    for m in (a, b):
        r = dict(turns[m])
        r.pop("created_at")
        r["metadata"] = json.loads(r["metadata"] or "{}")
        tombs.append(
            conv_store.Turn(**{**r, "tombstoned": True, "tombstone_reason": "compacted", "version": v})
        )
    raise_marks(ch, ns, "t")
    conv_store.insert(ch, [summary, *tombs])
    extra = {"spans": [SECRET]} if op == "conversation.redact" else {}
    got = await ok(call, op, admin, namespace=ns, agent="a", thread_id="t", msg_id=b, **extra)
    assert got["summaries_tombstoned"] == 1 and got["turns_restored"] == 1
    rows = {r["msg_id"]: r for r in turn_rows(ch, ns)}
    assert rows["sum-1"]["tombstoned"] and rows["sum-1"]["tombstone_reason"] == "recompact"
    assert rows["sum-1"]["content"] == ""
    assert tables_holding(ch, SECRET) == {}
    listed = await ok(call, "conversation.list", admin, namespace=ns, agent="a", thread_id="t")
    # The replaced turns are live again (embedded anew), for the next compaction.
    await _embedded(ch, ns, "t", a)
    if op == "conversation.redact":
        assert not rows[a]["tombstoned"] and not rows[b]["tombstoned"]
        assert rows[b]["content"] == "remember [redacted] for the trip"
        assert [m["msg_id"] for m in listed["messages"]] == [a, b]
        assert emb_row(ch, ns, "t", b)["text"] == "remember [redacted] for the trip"
    else:
        assert not rows[a]["tombstoned"] and rows[b]["tombstoned"] and rows[b]["content"] == ""
        assert [m["msg_id"] for m in listed["messages"]] == [a]


async def test_redact_refuses_bad_input_naming_the_field_and_writes_nothing(call, ns, writer, mint, services):
    admin = mint(ns, "admin")
    msg = (await append_turn(call, writer, ns, "a", "t", "user", "short text"))["msg_id"]
    body = {"namespace": ns, "agent": "a", "thread_id": "t", "msg_id": msg}
    r = await call("conversation.redact", admin, **body)
    assert r.status_code == 422 and r.json()["field"] == "spans"
    r = await call("conversation.redact", admin, ranges=[[3, 99]], **body)
    assert r.status_code == 422 and r.json()["field"] == "ranges.0" and r.json()["rule"] == "within_text"
    r = await call("conversation.redact", admin, spans=["text"], placeholder=KEY, **body)
    assert r.status_code == 422 and r.json()["field"] == "placeholder" and KEY not in r.text
    r = await call("conversation.redact", admin, spans=["text"], placeholder="", **body)
    assert r.status_code == 422
    r = await call("conversation.redact", writer, spans=["text"], **body)
    assert r.status_code == 403
    r = await call("conversation.redact", admin, spans=["text"], **{**body, "msg_id": "missing"})
    assert r.status_code == 404 and r.json()["field"] == "msg_id"
    rows = turn_rows(services.ch, ns, final=False)
    assert [x["content"] for x in rows] == ["short text"]


async def test_redacting_one_agents_copy_passes_the_shared_row_to_the_other_agents(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    text = "the ferry leaves at nine sharp"
    first = await append_turn(call, writer, ns, "a", "t", "user", text, run_id="ra")
    msg = first["msg_id"]
    await _embedded(services.ch, ns, "t", msg)
    await append_turn(call, writer, ns, "b", "t", "user", text, run_id="rb")
    red = await ok(
        call, "conversation.redact", admin, namespace=ns, agent="a", thread_id="t", msg_id=msg, spans=["nine"]
    )
    assert red["redacted"] and red["embedding"] == "handed_over"
    row = emb_row(services.ch, ns, "t", msg)
    assert (row["agent"], row["run_id"], row["text"], row["tombstoned"]) == ("b", "rb", text, False)
    copies = {r["agent"]: r["content"] for r in turn_rows(services.ch, ns)}
    assert copies == {"a": "the ferry leaves at [redacted] sharp", "b": text}
    # Agent a's older versions are gone; agent b's copy is b's own and stays.
    left = services.ch.query(
        "SELECT count() FROM conversations WHERE namespace = {ns:String} AND agent = 'a'",
        parameters={"ns": ns},
    ).result_rows[0][0]
    assert left == 1


async def test_a_redaction_racing_the_turns_own_embedding_leaves_no_vector_of_the_old_text(
    ns, writer, services, worker_embedder
):
    """The worker embeds a turn's text and writes its vector under the thread lease. A
    redaction that finds the turn with no embedding row yet waits for that vector with the
    lease released, then settles it: the row left is built from the redacted text."""
    from loom.models.conversation.lifecycle import RedactRequest
    from loom.ops.conversation import append
    from loom.ops.conversation.lifecycle.redacting import redact
    from loom.providers.embedders import FakeEmbedder
    from tests.conversation.helpers import turn

    worker_embedder(FakeEmbedder(delay_seconds=0.6))
    author = Principal("w", (ns,), Role.writer)  # `writer` turned recording on
    admin = Principal("x", (ns,), Role.admin)
    text = f"{SECRET} for the ferry trip"
    appending = asyncio.create_task(append(services, author, ns, "a", [turn("t", "user", text, msg_id="m1")]))

    async def landed() -> bool:
        return any(r["msg_id"] == "m1" for r in turn_rows(services.ch, ns))

    assert await wait_for(landed)
    assert emb_row(services.ch, ns, "t", "m1") is None  # its vector is still on its way
    ask = RedactRequest(namespace=ns, agent="a", thread_id="t", msg_id="m1", spans=[SECRET])
    receipt = await redact(services, admin, ask)
    assert receipt.done and receipt.embedding == "embedded"
    assert (await appending)[0].stored
    await asyncio.sleep(0.3)
    row = emb_row(services.ch, ns, "t", "m1")
    assert row is not None and SECRET not in row["text"] and len(row["embedding"]) > 0
    assert tables_holding(services.ch, SECRET) == {}


async def test_a_redaction_embeds_behind_the_speakers_name_with_the_prefix_on(
    call, ns, writer, mint, services, api_embedder
):
    from loom.providers.embedders import FakeEmbedder, SpyEmbedder

    await ok(
        call, "conversation.append", writer, namespace=ns, agent="a",
        turns=[{"thread_id": "t", "msg_id": "m", "role": "user", "content": "the ferry code is 1234 for Lisbon",
                "metadata": {"speaker": "Caroline"}}],
    )  # fmt: skip
    await _embedded(services.ch, ns, "t", "m")
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    before = services.settings
    services.settings = before.model_copy(update={"embed_speaker_prefix": True})
    try:
        red = await ok(
            call, "conversation.redact", mint(ns, "admin"), namespace=ns, agent="a", thread_id="t", msg_id="m",
            spans=["1234"], placeholder="[gone]",
        )  # fmt: skip
    finally:
        services.settings = before
    assert red["redacted"] and red["embedding"] == "embedded"
    assert spy.texts == ["Caroline: the ferry code is [gone] for Lisbon"]
    assert emb_row(services.ch, ns, "t", "m")["text"] == "the ferry code is [gone] for Lisbon"
