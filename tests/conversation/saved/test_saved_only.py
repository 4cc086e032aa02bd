"""A row stored only by a save belongs to its user (origin "saved", migration 007): the
saved-message ops serve it, conversation.search (vector and substring), threads, get
and list never do; unsave removes exactly such rows; an append of the turn while the
namespace records makes it recorded; the migration's rule for rows of earlier builds."""

from __future__ import annotations

from typing import Any

from clickhouse_schema.runner import discover
from loom.clock import next_version
from loom.providers.embedders import FakeEmbedder
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from tests.conversation.helpers import emb_row, ok, raise_marks, save, turn_rows

UNSAVE = "conversation.unsave_message"
TEXT = "the billing ledger migration finished after the invoices were re-exported"
QUERY = "billing ledger migration invoices"


class _Failing:
    """An embedder that always fails: search falls back to the substring match."""

    model_id = "failing"
    dim = 384

    def embed(self, texts: Any) -> Any:
        raise RuntimeError("embedder down")


async def _save(
    call: Any,
    token: str,
    ns: str,
    msg_id: str = "m1",
    thread_id: str = "c1",
    content: str = TEXT,
    user: str = "alice",
) -> dict[str, Any]:
    body = await save(
        call, token, namespace=ns, user_id=user, conversation_id=thread_id, message_id=msg_id, content=content
    )
    assert body["saved"] is True and body["indexed"] is True, body
    return body


async def _append(
    call: Any, token: str, ns: str, msg_id: str, content: str = TEXT, thread_id: str = "c1"
) -> dict[str, Any]:
    return await ok(
        call,
        "conversation.append",
        token,
        namespace=ns,
        thread_id=thread_id,
        msg_id=msg_id,
        role="user",
        content=content,
    )


async def _search_ids(call: Any, token: str, ns: str, query: str = QUERY) -> tuple[str, list[str]]:
    body = await ok(call, "conversation.search", token, query=query, namespace_scope="one", namespace=ns)
    return body["mode"], [h["msg_id"] for h in body["hits"]]


async def _saved_ids(call: Any, token: str, ns: str, query: str = QUERY) -> list[str]:
    body = await ok(
        call, "conversation.search_saved_messages", token, namespace=ns, user_id="alice", query=query
    )
    return [h["message_id"] for h in body["hits"]]


# -- what reads serve it -----------------------------------------------------------------


async def test_a_saved_only_row_is_never_searched_listed_or_read(call, ns, mint, services):
    token = mint(ns, "writer")  # the namespace does not record
    await _save(call, token, ns)
    [row] = turn_rows(services.ch, ns)
    assert row["origin"] == "saved"
    assert emb_row(services.ch, ns, "c1", "m1")["origin"] == "saved"
    # Its owner finds it through the saved-message ops.
    assert await _saved_ids(call, token, ns) == ["m1"]
    listed = await ok(call, "conversation.list_saved_messages", token, namespace=ns, user_id="alice")
    assert [m["message_id"] for m in listed["messages"]] == ["m1"]
    # conversation.search never does, by vector ...
    mode, hits = await _search_ids(call, token, ns)
    assert mode == "vector" and hits == []
    # ... nor do threads, get or list.
    threads = await ok(call, "conversation.threads", token, namespace=ns, agent="*")
    assert threads["threads"] == []
    r = await call("conversation.get", token, namespace=ns, thread_id="c1", include_messages=True)
    assert r.status_code == 404
    listing = await ok(call, "conversation.list", token, namespace=ns, thread_id="c1")
    assert listing["messages"] == []


async def test_a_saved_only_row_is_not_a_substring_hit(call, ns, mint, services, api_embedder):
    token = mint(ns, "writer")
    await _save(call, token, ns)
    api_embedder(_Failing())
    mode, hits = await _search_ids(call, token, ns, "invoices were re-exported")
    assert mode == "substring" and hits == []


async def test_a_saved_only_vector_never_reaches_the_vector_tables(call, ns, mint, services):
    """Even a search that would answer a fresh row unverified cannot meet it: the
    vector tables' feeds take recorded rows only."""
    token = mint(ns, "writer")
    await _save(call, token, ns)
    rows = services.ch.query(
        "SELECT count() FROM conversation_vectors_384 WHERE namespace = {ns:String}", parameters={"ns": ns}
    ).result_rows
    assert rows[0][0] == 0
    rows = services.ch.query(
        "SELECT count() FROM saved_vectors FINAL WHERE namespace = {ns:String} AND live",
        parameters={"ns": ns},
    ).result_rows
    assert rows[0][0] == 1  # the saved-message search has it


async def test_threads_and_get_count_only_recorded_turns(call, ns, writer, services):
    await _append(call, writer, ns, "r1", "we recorded this turn about the release train")
    await _save(call, writer, ns, msg_id="s1")  # new to the transcript: saved-only
    view = await ok(call, "conversation.get", writer, namespace=ns, thread_id="c1", include_messages=True)
    assert view["thread"]["turns"] == 1 and [m["msg_id"] for m in view["messages"]] == ["r1"]
    threads = await ok(call, "conversation.threads", writer, namespace=ns)
    [t] = threads["threads"]
    assert t["last_msg_id"] == "r1" and "release train" in t["excerpt"]
    mode, hits = await _search_ids(call, writer, ns)
    assert "s1" not in hits


async def test_verification_drops_a_saved_only_vector_an_earlier_build_indexed(call, ns, mint, services):
    """Before migration 007 the vector tables took every vector: such a row is below the
    marks the migration raised, and verification drops it (its transcript copy is not
    recorded)."""
    token = mint(ns, "writer")
    await _save(call, token, ns)
    services.ch.command(
        "INSERT INTO conversation_vectors_384 (namespace, thread_id, msg_id, version, agent, role, run_id, user_id, "
        "ts, text, embedding) SELECT namespace, thread_id, msg_id, version, agent, role, run_id, user_id, ts, text, "
        "embedding FROM conversation_embeddings FINAL WHERE namespace = {ns:String}",
        parameters={"ns": ns},
    )
    raise_marks(services.ch, ns)
    mode, hits = await _search_ids(call, token, ns)
    assert mode == "vector" and hits == []


# -- unsave, both ways ---------------------------------------------------------------------


async def test_unsave_removes_a_saved_only_row_even_where_recording_is_on_now(
    call, ns, mint, recording, services
):
    token = mint(ns, "writer")
    await _save(call, token, ns)
    recording(ns, True)  # the switch does not decide: the origin does
    body = await ok(call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c1", message_id="m1")
    assert body == {"found": True, "removed": True}
    assert turn_rows(services.ch, ns) == []
    assert emb_row(services.ch, ns, "c1", "m1")["tombstoned"] is True


async def test_unsave_keeps_a_recorded_row_even_where_recording_is_off_now(
    call, ns, writer, recording, services
):
    """Recorded while the switch was on, saved after it was switched off: it stays."""
    await _append(call, writer, ns, "m1")
    recording(ns, False)
    await _save(call, writer, ns)
    [row] = turn_rows(services.ch, ns)
    assert row["origin"] == "recorded" and row["is_saved"] is True
    body = await ok(
        call, UNSAVE, writer, namespace=ns, user_id="alice", conversation_id="c1", message_id="m1"
    )
    assert body == {"found": True, "removed": False}
    [row] = turn_rows(services.ch, ns)
    assert row["is_saved"] is False and not row["tombstoned"] and row["origin"] == "recorded"
    emb = emb_row(services.ch, ns, "c1", "m1")
    assert emb["is_saved"] is False and not emb["tombstoned"] and len(emb["embedding"]) == 384
    assert (await _search_ids(call, writer, ns))[1] == ["m1"]


async def test_unsave_of_a_recorded_row_keeps_it_while_recording_stays_on(call, ns, writer, services):
    await _append(call, writer, ns, "m1")
    await _save(call, writer, ns)
    body = await ok(
        call, UNSAVE, writer, namespace=ns, user_id="alice", conversation_id="c1", message_id="m1"
    )
    assert body == {"found": True, "removed": False}
    assert [r["msg_id"] for r in turn_rows(services.ch, ns)] == ["m1"]


# -- an append makes it recorded ---------------------------------------------------------


async def test_an_append_while_recording_makes_a_saved_only_row_recorded(call, ns, mint, recording, services):
    token = mint(ns, "writer")
    await _save(call, token, ns)
    off = await _append(call, token, ns, "m1")
    assert off["stored"] is False and off["reason"] == "logging_disabled"
    assert turn_rows(services.ch, ns)[0]["origin"] == "saved"
    recording(ns, True)
    for _ in range(2):  # idempotent: the second append changes nothing
        body = await _append(call, token, ns, "m1")
        assert body["stored"] is False and body["reason"] == "duplicate", body
        [row] = turn_rows(services.ch, ns)
        assert row["origin"] == "recorded" and row["is_saved"] is True and row["user_id"] == "alice"
        assert emb_row(services.ch, ns, "c1", "m1")["origin"] == "recorded"
    assert (await _search_ids(call, token, ns))[1] == ["m1"]
    view = await ok(call, "conversation.get", token, namespace=ns, thread_id="c1", include_messages=True)
    assert [m["msg_id"] for m in view["messages"]] == ["m1"]
    # Recorded now: unsaving keeps it in the transcript.
    body = await ok(call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c1", message_id="m1")
    assert body == {"found": True, "removed": False}
    assert [r["msg_id"] for r in turn_rows(services.ch, ns)] == ["m1"]


async def test_an_append_after_the_save_claim_expired_still_makes_it_recorded(
    call, ns, mint, recording, services
):
    """The append reads the row from ClickHouse (no save claim left in Redis)."""
    from loom.ops.conversation.writing.appending import claim_key

    token = mint(ns, "writer")
    await _save(call, token, ns)
    await services.redis.delete(claim_key((ns, "default", "c1", "m1")))
    recording(ns, True)
    body = await _append(call, token, ns, "m1")
    assert body["reason"] == "duplicate"
    assert turn_rows(services.ch, ns)[0]["origin"] == "recorded"


async def test_concurrent_appends_of_a_saved_only_turn_record_it_once(call, ns, mint, recording, services):
    import asyncio

    token = mint(ns, "writer")
    await _save(call, token, ns)
    recording(ns, True)
    bodies = await asyncio.gather(*(_append(call, token, ns, "m1") for _ in range(4)))
    assert {b["reason"] for b in bodies} == {"duplicate"}
    [row] = turn_rows(services.ch, ns)
    assert row["origin"] == "recorded" and row["is_saved"] is True
    recorded = services.ch.query(
        "SELECT count() FROM conversations WHERE namespace = {ns:String} AND origin = 'recorded'",
        parameters={"ns": ns},
    ).result_rows[0][0]
    assert recorded == 1  # one new version, however many appends raced
    assert (await _search_ids(call, token, ns))[1] == ["m1"]


async def test_a_saved_only_copy_leaves_another_agents_recorded_copy_searchable(call, ns, writer, services):
    """Agent "other" saves its own (new) copy of a turn agent "default" recorded: the
    shared embedding row keeps serving the recorded copy to conversation.search."""
    await _append(call, writer, ns, "m1")
    body = await save(
        call, writer, namespace=ns, conversation_id="c1", message_id="m1", agent="other", content=TEXT
    )
    assert body["saved"] is True and body["indexed"] is True
    origin = {r["agent"]: r["origin"] for r in turn_rows(services.ch, ns)}
    assert origin == {"default": "recorded", "other": "saved"}
    body = await ok(call, "conversation.search", writer, query=QUERY, namespace_scope="one", namespace=ns)
    assert [(h["agent"], h["msg_id"]) for h in body["hits"]] == [("default", "m1")]
    assert await _saved_ids(call, writer, ns) == ["m1"]
    body = await ok(
        call,
        UNSAVE,
        writer,
        namespace=ns,
        user_id="alice",
        conversation_id="c1",
        message_id="m1",
        agent="other",
    )
    assert body == {"found": True, "removed": True}
    assert [r["agent"] for r in turn_rows(services.ch, ns)] == ["default"]
    body = await ok(call, "conversation.search", writer, query=QUERY, namespace_scope="one", namespace=ns)
    assert [(h["agent"], h["msg_id"]) for h in body["hits"]] == [("default", "m1")]


async def test_an_append_that_loses_to_an_unsave_answers_deleted(call, ns, mint, recording, services):
    """The unsave took the thread lease first and removed the row: nothing is left to
    record, and the append says so."""
    from loom.ops.conversation.writing import origin

    token = mint(ns, "writer")
    await _save(call, token, ns)
    key = (ns, "default", "c1", "m1")
    await ok(call, UNSAVE, token, namespace=ns, user_id="alice", conversation_id="c1", message_id="m1")
    assert await origin.record_saved(services, [key]) == {key}
    assert turn_rows(services.ch, ns) == []


# -- the migration's rule for rows of earlier builds ------------------------------------


def _old_row(
    ns: str, thread_id: str, msg_id: str, *, saved: bool, agent: str = "default", tombstoned: bool = False
) -> conv_store.Turn:
    from loom.clock import utcnow

    now = utcnow()
    return conv_store.Turn(
        namespace=ns,
        agent=agent,
        thread_id=thread_id,
        msg_id=msg_id,
        ts=now,
        role="user",
        content=f"{msg_id}: {TEXT}",
        user_id="alice" if saved else "",
        is_saved=saved,
        saved_at=now.replace(microsecond=0) if saved else None,
        tombstoned=tombstoned,
        version=next_version(),
    )


async def test_migration_007_sorts_rows_of_earlier_builds(ns, services):
    rows = [
        _old_row(ns, "alone", "a1", saved=True),  # a thread of saved rows only: saved-only
        _old_row(ns, "alone", "a2", saved=True),
        _old_row(ns, "mixed", "b1", saved=True),  # beside a turn nobody saved: recorded
        _old_row(ns, "mixed", "b2", saved=False),
        _old_row(ns, "gone", "c1", saved=True),  # beside a tombstoned recorded turn: recorded
        _old_row(ns, "gone", "c2", saved=False, tombstoned=True),
        _old_row(ns, "mixed", "d1", saved=True, agent="other"),  # another agent's thread: saved-only
    ]
    conv_store.insert(services.ch, rows)
    fake = FakeEmbedder()
    for r in rows:
        if r.is_saved:
            vec = fake.embed([r.content])[0]
            emb_store.insert(
                services.ch,
                [
                    emb_store.EmbeddingRow(
                        ns,
                        r.thread_id,
                        r.msg_id,
                        r.agent,
                        "user",
                        "",
                        "alice",
                        r.ts,
                        r.content,
                        vec,
                        fake.model_id,
                        is_saved=True,
                        saved_at=r.saved_at,
                        version=next_version(),
                    )
                ],
            )
    # Rows as an earlier build wrote them: every one reads 'recorded' (the column's default).
    raise_marks(services.ch, ns)
    assert {r["origin"] for r in turn_rows(services.ch, ns)} == {"recorded"}

    written = {(r.agent, r.thread_id, r.msg_id): r.version for r in rows}
    first: dict[tuple[str, str, str], int] = {}
    [migration] = [m for m in discover() if m.number == 7]
    for _ in range(2):  # idempotent
        for statement in migration.statements():
            services.ch.command(statement)
        origin = {(r["agent"], r["thread_id"], r["msg_id"]): r["origin"] for r in turn_rows(services.ch, ns)}
        assert origin == {
            ("default", "alone", "a1"): "saved",
            ("default", "alone", "a2"): "saved",
            ("default", "mixed", "b1"): "recorded",
            ("default", "mixed", "b2"): "recorded",
            ("default", "gone", "c1"): "recorded",
            ("default", "gone", "c2"): "recorded",
            ("other", "mixed", "d1"): "saved",
        }
        assert emb_row(services.ch, ns, "alone", "a1")["origin"] == "saved"
        assert emb_row(services.ch, ns, "mixed", "b1")["origin"] == "recorded"
        assert emb_row(services.ch, ns, "mixed", "d1")["origin"] == "saved"
        # One new version per saved-only row, written once: the second run writes nothing.
        # (Versions are compared, not counted: a background merge may collapse old ones.)
        latest = {(r["agent"], r["thread_id"], r["msg_id"]): r["version"] for r in turn_rows(services.ch, ns)}
        first = first or latest
        assert latest == first
        rewritten = {k for k, v in latest.items() if v != written[k]}
        assert rewritten == {k for k, o in origin.items() if o == "saved"}
    marks = services.ch.query(
        "SELECT max(mark) FROM search_marks WHERE namespace = {ns:String} AND thread_id = ''",
        parameters={"ns": ns},
    ).result_rows[0][0]
    assert marks > next_version()  # their old vectors are verified from now on
