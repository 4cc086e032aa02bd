"""erasure.request / erasure.status / erasure.export: a user's rows tombstoned at once
and removed by the worker, the receipt, purge and the shared-row hand-over, namespace
erasure (every table and Redis key), a removal killed halfway and resumed, the export
with and without tombstones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.ops.erasure import export, requesting
from loom.store import fences, landed, recording_cache, search_marks
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import emb_rows, ok, turn_rows

VECTOR_TABLES = ("conversation_vectors_384", "conversation_vectors_1536")


async def _append(call, token, ns, thread, role, content, user, agent="default"):
    return await ok(
        call,
        "conversation.append",
        token,
        namespace=ns,
        agent=agent,
        thread_id=thread,
        role=role,
        content=content,
        user_id=user,
    )


async def _seed_user(call, writer, ns, user, thread):
    """Three turns, one saved, and a brief of the user's."""
    a = await _append(call, writer, ns, thread, "user", f"{user} asks about the ledger migration", user)
    await _append(call, writer, ns, thread, "assistant", f"{user} hears that invoices moved", user)
    await _append(call, writer, ns, thread, "tool", "exit 0", user)
    await ok(
        call,
        "conversation.save_message",
        writer,
        namespace=ns,
        user_id=user,
        conversation_id=thread,
        message_id=a["msg_id"],
    )
    await ok(
        call,
        "session.brief_save",
        writer,
        namespace=ns,
        brief_key=f"brief-{user}",
        user_id=user,
        sections={"goal": f"{user}'s line of work"},
    )
    return a["msg_id"]


def _count(ch, table, where, params):
    return int(
        ch.query(
            f"SELECT count() FROM {table} WHERE {where} SETTINGS apply_deleted_mask = 0", parameters=params
        ).result_rows[0][0]
    )


async def _done(call, admin, erasure_id):
    async def finished() -> bool:
        body = (await call("erasure.status", admin, erasure_id=erasure_id)).json()
        return body["state"] == "done"

    assert await wait_for(finished, timeout=30)
    return await ok(call, "erasure.status", admin, erasure_id=erasure_id)


async def test_a_user_erasure_is_unreadable_at_once_then_removed_with_a_receipt(
    call, ns, writer, mint, services
):
    admin, viewer = mint(ns, "admin"), mint(ns, "viewer")
    ch = services.ch
    saved_msg = await _seed_user(call, writer, ns, "u1", "t1")
    await _seed_user(call, writer, ns, "u2", "t2")
    # Rows, not versions: a background merge may collapse a row's versions before the removal.
    before_rows = _count(ch, "conversations FINAL", "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns})
    got = await ok(call, "erasure.request", admin, user_id="u1")
    receipt = got["receipt"]
    assert receipt["kind"] == "user" and receipt["namespaces"] == [ns] and len(receipt["digest"]) == 64
    assert receipt["tables"]["conversations"]["tombstoned"] == 3
    assert receipt["tables"]["conversation_embeddings"]["tombstoned"] == 2
    assert receipt["tables"]["session_briefs"]["tombstoned"] == 1
    assert len(receipt["tables"]["conversations"]["digests"][ns]) == 16
    # Nothing of u1 is readable by any op, right away.
    listed = await ok(call, "conversation.list", viewer, namespace=ns, thread_id="t1")
    assert listed["messages"] == []
    assert _count(ch, "conversation_terms", "namespace = {ns:String} AND thread_id = 't1'", {"ns": ns}) > 0
    for mode in ("vector", "hybrid", "lexical"):
        hits = await ok(
            call, "conversation.search", viewer, query="u1 asks about the ledger migration", search_mode=mode
        )
        assert all(h["thread_id"] != "t1" for h in hits["hits"]), mode
    lexical = await ok(call, "conversation.search", viewer, query="ledger migration", search_mode="lexical")
    assert {h["thread_id"] for h in lexical["hits"]} == {"t2"}  # the test can fail: u2's turns are found
    saved = await ok(call, "conversation.list_saved_messages", viewer, namespace=ns, user_id="u1")
    assert saved["messages"] == []
    status = await ok(
        call,
        "conversation.saved_status",
        viewer,
        namespace=ns,
        user_id="u1",
        conversation_id="t1",
        message_ids=[saved_msg],
    )
    assert status["saved"] == {saved_msg: False}
    r = await call("session.brief_get", viewer, namespace=ns, brief_key="brief-u1")
    assert r.status_code == 404
    # The worker removes the rows from disk (every version), the saved indexes and the
    # vector tables' copies; the embedding rows stay as tombstones (no purge).
    done = await _done(call, admin, got["erasure_id"])
    assert done["steps_done"] == done["steps_total"] > 0 and done["receipt"]["removed_at"]
    assert done["receipt"]["tables"]["conversations"]["removed"] >= before_rows
    assert _count(ch, "conversations", "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0
    for table in ("saved_docs", "saved_terms", "saved_vectors"):
        assert _count(ch, table, "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0
    assert _count(ch, "conversation_terms", "namespace = {ns:String} AND thread_id = 't1'", {"ns": ns}) == 0
    assert done["receipt"]["tables"]["conversation_terms"]["removed"] > 0
    for table in VECTOR_TABLES:
        assert _count(ch, table, "namespace = {ns:String} AND thread_id = 't1'", {"ns": ns}) == 0
    embs = [e for e in emb_rows(ch, ns) if e["thread_id"] == "t1"]
    assert embs and all(e["tombstoned"] and e["text"] == "" for e in embs)
    assert _count(ch, "session_briefs", "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0
    assert (
        _count(ch, "session_brief_revisions", "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0
    )
    assert _count(ch, "erasure_keys", "erasure_id = {e:String}", {"e": got["erasure_id"]}) == 0
    # u2 is untouched.
    assert len([t for t in turn_rows(ch, ns) if t["user_id"] == "u2" and not t["tombstoned"]]) == 3
    r = await call("session.brief_get", viewer, namespace=ns, brief_key="brief-u2")
    assert r.status_code == 200
    # Asking again is safe: nothing left to tombstone, the same subject digest for an empty set.
    again = await ok(call, "erasure.request", admin, user_id="u1")
    assert again["receipt"]["tables"]["conversations"]["tombstoned"] == 0
    await _done(call, admin, again["erasure_id"])


def _digest_of(ch, sql, params):
    """A receipt's key digest as an operator recomputes it from the rows: the sum of the
    distinct sipHash64 of the keys, mod 2^64, in hex."""
    total = ch.query(
        f"SELECT toString(sum(h)) FROM (SELECT DISTINCT sipHash64(*) AS h FROM ({sql}))", parameters=params
    ).result_rows[0][0]
    return format(int(total or 0), "016x")


async def test_a_receipts_digests_are_those_of_the_users_keys(call, ns, writer, mint, services):
    """The request reads its digests in one pass over the keys it fixed, beside the
    tombstones: each equals the digest recomputed from the user's rows, and a key set
    that differs gives a different digest."""
    admin = mint(ns, "admin")
    ch = services.ch
    await _seed_user(call, writer, ns, "u1", "t1")
    await _seed_user(call, writer, ns, "u1", "t1b")
    await _seed_user(call, writer, ns, "u2", "t2")
    p = {"ns": ns}
    mine = "WHERE namespace = {ns:String} AND user_id = 'u1'"
    expected = {
        "conversations": _digest_of(
            ch, f"SELECT toString(agent), thread_id, msg_id FROM conversations {mine} GROUP BY 1, 2, 3", p
        ),
        "conversation_embeddings": _digest_of(
            ch, f"SELECT thread_id, msg_id FROM conversation_embeddings {mine} GROUP BY 1, 2", p
        ),
        "threads": _digest_of(
            ch, f"SELECT toString(agent), thread_id FROM conversations {mine} GROUP BY 1, 2", p
        ),
        "session_briefs": _digest_of(ch, f"SELECT brief_key FROM session_briefs {mine} GROUP BY 1", p),
    }
    other = _digest_of(
        ch,
        "SELECT toString(agent), thread_id, msg_id FROM conversations "
        "WHERE namespace = {ns:String} AND user_id = 'u2' GROUP BY 1, 2, 3",
        p,
    )
    got = await ok(call, "erasure.request", admin, user_id="u1")
    tables = got["receipt"]["tables"]
    assert {t: tables[t]["digests"][ns] for t in expected} == expected
    assert tables["conversations"]["tombstoned"] == 6 and tables["threads"]["tombstoned"] == 2
    assert expected["conversations"] != other and expected["conversations"] != format(0, "016x")
    await _done(call, admin, got["erasure_id"])


async def test_purge_removes_the_embedding_rows_but_a_shared_row_passes_to_the_other_users_copy(
    call, ns, writer, mint, services
):
    admin = mint(ns, "admin")
    ch = services.ch
    text = "the export job moved to the new ledger"
    shared = await _append(call, writer, ns, "t", "user", text, "u1", agent="a")
    await _append(call, writer, ns, "t", "user", text, "u2", agent="b")
    await _append(call, writer, ns, "t", "assistant", "only u1 said this", "u1", agent="a")
    # A turn whose message the retention TTL expired: its embedding row is tombstoned, and
    # stays on disk (only a namespace erasure removes such a row).
    expired = await _append(call, writer, ns, "t2", "user", "expired words of u1", "u1", agent="a")
    ch.command(
        "DELETE FROM conversations WHERE namespace = {ns:String} AND thread_id = 't2'", parameters={"ns": ns}
    )
    got = await ok(call, "erasure.request", admin, user_id="u1", namespaces=[ns], purge=True)
    assert got["receipt"]["tables"]["handed_over"]["tombstoned"] == 1
    assert got["receipt"]["tables"]["conversation_embeddings"]["tombstoned"] == 2
    await _done(call, admin, got["erasure_id"])
    rows = {e["msg_id"]: e for e in emb_rows(ch, ns)}
    gone_msg = rows.pop(expired["msg_id"])
    assert gone_msg["tombstoned"] and gone_msg["text"] == ""
    assert list(rows) == [shared["msg_id"]]  # u1's own row is gone from disk
    assert (rows[shared["msg_id"]]["agent"], rows[shared["msg_id"]]["user_id"]) == ("b", "u2")
    assert not rows[shared["msg_id"]]["tombstoned"]
    assert (
        _count(
            ch,
            "conversation_embeddings",
            "namespace = {ns:String} AND user_id = 'u1' AND thread_id = 't'",
            {"ns": ns},
        )
        == 0
    )
    hits = await ok(call, "conversation.search", admin, query=text)
    assert [(h["agent"], h["msg_id"]) for h in hits["hits"]][:1] == [("b", shared["msg_id"])]


async def test_a_removal_killed_halfway_resumes_and_counts_each_row_once(
    call, ns, writer, mint, services, monkeypatch
):
    ch = services.ch
    await _seed_user(call, writer, ns, "u1", "t1")
    where = "namespace = {ns:String} AND user_id = 'u1'"
    versions_before = _count(ch, "conversations", where, {"ns": ns})
    rows_before = _count(ch, "conversations FINAL", where, {"ns": ns})

    async def no_worker(svc: Any, erasure_id: str) -> None:  # the job is run by hand below
        return None

    monkeypatch.setattr(requesting, "_enqueue", no_worker)
    who = Principal("adm", (ns,), Role.admin)
    req = await requesting.request(
        services, who, user_id="u1", namespaces=None, namespace_list=None, purge=True
    )
    with pytest.raises(requesting._Crash):
        await requesting.run_removal(services, req.erasure_id, crash_after=2)  # killed after two steps
    halfway = await requesting.status(services, who, req.erasure_id)
    assert halfway.state == "removing" and halfway.steps_done == 2 < halfway.steps_total
    assert _count(ch, "conversations", "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0
    # The retry (what the pool does with a job whose worker died) resumes and finishes.
    finished = await requesting.run_removal(services, req.erasure_id)
    assert finished.state == "done" and finished.steps_done == finished.steps_total
    # Every version, each counted once: at most the versions as they were plus the erasure's
    # three tombstones (a background merge may have collapsed some first), at least one a row.
    removed = finished.receipt.tables["conversations"].removed
    assert rows_before <= removed <= versions_before + 3
    assert finished.receipt.digest == req.receipt.digest
    # Running it once more changes nothing.
    assert (await requesting.run_removal(services, req.erasure_id)).receipt == finished.receipt
    for table in ("conversations", "conversation_embeddings", "saved_docs", "saved_terms", "saved_vectors"):
        assert _count(ch, table, "namespace = {ns:String} AND user_id = 'u1'", {"ns": ns}) == 0, table


async def test_a_namespace_erasure_removes_every_table_and_every_redis_key(
    call, ns, mint, recording, services
):
    ch = services.ch
    sibling = f"{ns}:x"  # a namespace whose name extends this one: left alone
    for name in (ns, sibling):
        recording(name, True)
    writer = mint([ns, sibling], "writer")
    for name in (ns, sibling):
        await _seed_user(call, writer, name, "u1", "t1")
    await ok(
        call, "conversation.delete", mint(ns, "admin"), namespace=ns, thread_id="t1", confirm_thread_id="t1"
    )
    redis = services.redis
    keys_before = {k.decode() async for k in redis.scan_iter(match=f"loom:*{ns}*")}
    assert any(k.startswith("loom:claim:turn:") for k in keys_before)
    assert any(k.startswith("loom:landed:") for k in keys_before)
    assert await redis.exists(fences.key(ns))
    admin = mint([ns, sibling], "admin")
    r = await call("erasure.request", admin, namespace_list=[ns])
    assert r.status_code == 422 and r.json()["field"] == "purge"
    got = await ok(call, "erasure.request", admin, namespace_list=[ns], purge=True)
    tables = got["receipt"]["tables"]
    assert tables["conversations"]["tombstoned"] > 0 and tables["redis_keys"]["removed"] > 0
    # Unreadable at once.
    listed = await ok(call, "conversation.list", admin, namespace=ns, thread_id="t1")
    assert listed["messages"] == []
    await _done(call, admin, got["erasure_id"])
    from loom.store.erasure import NAMESPACE_TABLES

    for table in NAMESPACE_TABLES:
        assert _count(ch, table, "namespace = {ns:String}", {"ns": ns}) == 0, table
    left = {k.decode() async for k in redis.scan_iter(match="loom:*")}
    mine = {
        k
        for k in left
        if k.startswith((f"loom:claim:turn:{ns}:", f"loom:landed:{ns}:"))
        and not k.startswith((f"loom:claim:turn:{sibling}:", f"loom:landed:{sibling}:"))
    }
    assert mine == set()
    for key in (search_marks.key(ns), recording_cache.key(ns), fences.key(ns), landed.ready_key(ns)):
        assert not await redis.exists(key)
    # The sibling namespace keeps its rows and keys.
    assert _count(ch, "conversations", "namespace = {ns:String}", {"ns": sibling}) > 0
    assert any(k.startswith(f"loom:claim:turn:{sibling}:") for k in left)


async def _export_lines(call, admin, **body) -> list[dict[str, Any]]:
    r = await call("erasure.export", admin, **body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


async def test_export_streams_the_users_rows_with_and_without_tombstones(call, ns, writer, mint, services):
    admin = mint(ns, "admin")
    await _seed_user(call, writer, ns, "u1", "t1")
    await _append(call, writer, ns, "t2", "user", "a turn to delete", "u1")
    await _seed_user(call, writer, ns, "u2", "t3")
    await ok(call, "conversation.delete", admin, namespace=ns, thread_id="t2", confirm_thread_id="t2")
    lines = await _export_lines(call, admin, user_id="u1")
    kinds = [x["kind"] for x in lines]
    assert kinds[0] == "export" and kinds[-1] == "end" and lines[-1]["rows"] == len(lines) - 2
    turns = [x for x in lines if x["kind"] == "turn"]
    assert len(turns) == 4 and {t["user_id"] for t in turns} == {"u1"}
    assert [t["tombstone_reason"] for t in turns if t["tombstoned"]] == ["deleted"]
    assert sum(t["is_saved"] for t in turns) == 1
    assert kinds.count("brief") == 1 and kinds.count("brief_revision") == 1
    assert all(
        k in ("export", "turn", "brief", "brief_revision", "end") for k in kinds
    )  # never an embedding row
    live = await _export_lines(call, admin, user_id="u1", include_tombstoned=False)
    assert len([x for x in live if x["kind"] == "turn"]) == 3
    # Paged in key order: the same rows whatever the page size.
    who = Principal("adm", (ns,), Role.admin)
    paged = b"".join([chunk async for chunk in export(services, who, "u1", None, page_rows=1)])
    small = [json.loads(x) for x in paged.splitlines()]
    assert [x for x in small if x["kind"] == "turn"] == turns
    r = await call("erasure.export", writer, user_id="u1")
    assert r.status_code == 403
