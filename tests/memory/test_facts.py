"""memory.set, memory.search, memory.list, memory.delete."""

from __future__ import annotations

from typing import Any

from loom.clock import utcnow
from loom.ops.embedding import inline
from loom.providers.embedders import FakeEmbedder
from loom.store import bm25

HIGH_FACT = "my SSN is 123-45-6789"


async def _set(call: Any, token: str, ns: str, *facts: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    r = await call("memory.set", token, namespace=ns, facts=list(facts), **extra)
    assert r.status_code == 200, r.text
    return r.json()["results"]  # type: ignore[no-any-return]


async def test_set_then_search_finds_the_fact_with_score_source_and_time(call, ns, mint):
    w = mint(ns, "writer")
    out = await _set(
        call,
        w,
        ns,
        {"text": "Prefers dark mode in every editor", "kind": "preference"},
        {"text": "Works at Acme as a data engineer"},
        user_id="u1",
    )
    assert [o["stored"] for o in out] == [True, True] and all(o["indexed"] for o in out)
    r = await call("memory.search", w, namespace=ns, user_id="u1", query="dark mode editor")
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits[0]["text"] == "Prefers dark mode in every editor"
    assert hits[0]["source"] == "set" and hits[0]["kind"] == "preference"
    assert "lexical" in hits[0]["legs"] and hits[0]["score"] > 0 and hits[0]["created_at"].endswith("Z")
    # Another user's memory is not searched.
    r = await call("memory.search", w, namespace=ns, user_id="u2", query="dark mode editor")
    assert r.json()["hits"] == []


async def test_a_key_names_one_chain(call, ns, mint):
    """The same text again revises the key's fact in place; a different text supersedes it
    (a new id; the old one is kept, closed: see tests/memory/test_validity.py)."""
    w = mint(ns, "writer")
    first = await _set(call, w, ns, {"text": "Lives in Berlin", "key": "home_city"}, user_id="u1")
    again = await _set(call, w, ns, {"text": "Lives in Berlin", "key": "home_city"}, user_id="u1")
    assert again[0]["memory_id"] == first[0]["memory_id"] and again[0]["supersedes"] is None
    second = await _set(call, w, ns, {"text": "Lives in Lisbon", "key": "home_city"}, user_id="u1")
    assert second[0]["memory_id"] != first[0]["memory_id"]
    assert second[0]["supersedes"] == first[0]["memory_id"]
    assert not first[0]["updated"] and again[0]["updated"] and second[0]["updated"]
    r = await call("memory.list", w, namespace=ns, user_id="u1")
    assert [f["text"] for f in r.json()["facts"]] == ["Lives in Lisbon"]
    r = await call("memory.search", w, namespace=ns, user_id="u1", query="Berlin")
    assert r.json()["hits"] == []


async def test_a_fact_that_reads_as_high_is_refused_and_not_stored(call, ns, mint, leak_spy):
    w = mint(ns, "writer")
    out = await _set(call, w, ns, {"text": HIGH_FACT}, {"text": "Has a cat named Miso"}, user_id="u1")
    assert out[0] == {
        "memory_id": None,
        "stored": False,
        "updated": False,
        "indexed": False,
        "supersedes": None,
        "reason": "high_sensitivity",
    }
    assert out[1]["stored"]
    r = await call("memory.list", w, namespace=ns, user_id="u1")
    assert [f["text"] for f in r.json()["facts"]] == ["Has a cat named Miso"]


async def test_an_embed_failure_stores_the_fact_for_bm25_only(call, ns, mint, services):
    class Broken(FakeEmbedder):
        def embed(self, texts: Any) -> Any:
            raise RuntimeError("model down")

    w = mint(ns, "writer")
    previous = inline.install(services, Broken())
    try:
        out = await _set(call, w, ns, {"text": "Takes the 7:40 train to work"}, user_id="u1")
    finally:
        inline.install(services, previous)
    assert out[0]["stored"] and not out[0]["indexed"] and out[0]["reason"] == "embed_failed"
    row = services.ch.query(
        "SELECT embed_error, length(embedding) FROM memories FINAL WHERE namespace = {ns:String}",
        parameters={"ns": ns},
    ).result_rows
    assert row[0][0].startswith("embedder_unavailable") or row[0][0].startswith("internal_error"), row
    assert row[0][1] == 0
    r = await call("memory.search", w, namespace=ns, user_id="u1", query="train to work")
    assert [h["legs"] for h in r.json()["hits"]] == [["lexical"]]


async def test_delete_forgets_and_list_pages(call, ns, mint):
    w = mint(ns, "writer")
    out = await _set(
        call, w, ns, *({"text": f"Fact number {i} about gardening"} for i in range(5)), user_id="u1"
    )
    r = await call("memory.list", w, namespace=ns, user_id="u1", limit=2)
    page1 = r.json()
    assert len(page1["facts"]) == 2 and page1["next_cursor"]
    r = await call("memory.list", w, namespace=ns, user_id="u1", limit=10, cursor=page1["next_cursor"])
    assert len(r.json()["facts"]) == 3
    gone = out[0]["memory_id"]
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[gone, "mnope"])
    assert r.json() == {"deleted": [gone], "forgotten": [gone]}
    r = await call("memory.search", w, namespace=ns, user_id="u1", query="Fact number 0 gardening", limit=10)
    assert gone not in [h["memory_id"] for h in r.json()["hits"]] and len(r.json()["hits"]) == 4
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[gone])
    assert r.json() == {"deleted": [], "forgotten": []}


async def test_an_own_user_token_acts_as_its_user_with_at_me(call, ns, mint):
    w = mint(ns, "writer")
    await _set(call, w, ns, {"text": "Allergic to peanuts"}, user_id="alice")
    await _set(call, w, ns, {"text": "Allergic to shellfish"}, user_id="bob")
    alice = mint(ns, "viewer", read_scope="own_user", read_user_id="alice")
    r = await call("memory.search", alice, namespace="@me", query="allergic")
    assert [h["text"] for h in r.json()["hits"]] == ["Allergic to peanuts"]
    r = await call("memory.search", alice, namespace="@me", user_id="bob", query="allergic")
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    r = await call("memory.set", alice, namespace="@me", facts=[{"text": "x"}])
    assert r.status_code == 403  # a viewer cannot write


async def test_a_viewer_cannot_write_and_user_is_required(call, ns, mint):
    v = mint(ns, "viewer")
    r = await call("memory.set", v, namespace=ns, user_id="u1", facts=[{"text": "x"}])
    assert r.status_code == 403
    w = mint(ns, "writer")
    r = await call("memory.set", w, namespace=ns, facts=[{"text": "x"}])
    assert r.status_code == 422 and r.json()["field"] == "user_id"
    r = await call("memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "   "}])
    assert r.status_code == 422 and r.json()["field"] == "facts[0].text"


async def test_briefs_are_never_in_memory_search(call, ns, mint):
    w = mint(ns, "writer")
    r = await call(
        "session.brief_save",
        w,
        namespace=ns,
        brief_key="ledger",
        sections={"goal": "Move invoices to the new ledger zebracorn"},
    )
    assert r.status_code == 200, r.text
    await _set(call, w, ns, {"text": "Likes tea"}, user_id="u1")
    for user in ("u1", ""):
        body: dict[str, Any] = {"user_id": user} if user else {"user_id": "default"}
        r = await call("memory.search", w, namespace=ns, query="invoices new ledger zebracorn", **body)
        assert r.status_code == 200 and r.json()["hits"] == []


async def test_bm25_ranks_as_the_sql_reference_does(call, ns, mint, services):
    """The serving BM25 (one join, scored in Python) answers what the whole-SQL ranking
    answers: the same rows, order, scores and matched terms, for facts and evidence,
    whole scope and one session, with a revised and a forgotten fact in the corpus."""
    from loom.store import evidence as ev_store
    from loom.store import memories as store

    w = mint(ns, "writer")
    texts = [
        "Drinks coffee every morning in Kyoto",
        "Plays the cello in a garden orchestra",
        "Keeps the billing ledger for the coffee shop",
        "Grows coffee plants in the garden",
        "Reads about Kyoto gardens and coffee ceremonies on the train",
    ]
    await _set(call, w, ns, *({"text": t} for t in texts), user_id="u1")
    await _set(call, w, ns, {"text": "coffee twice a day", "key": "habit"}, user_id="u1", session_id="s1")
    await _set(
        call,
        w,
        ns,
        {"text": "coffee, then tea, in the garden", "key": "habit"},
        user_id="u1",
        session_id="s1",
    )
    gone = await _set(call, w, ns, {"text": "coffee garden kyoto cello"}, user_id="u1")
    r = await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[gone[0]["memory_id"]])
    assert r.status_code == 200, r.text
    r = await call(
        "memory.set_from_messages",
        w,
        namespace=ns,
        user_id="u1",
        messages=[
            {"role": "user", "content": "I had coffee in the garden"},
            {"role": "user", "content": "coffee " + HIGH_FACT},
            {"role": "assistant", "content": "Kyoto has famous coffee gardens"},
        ],
    )
    assert r.status_code == 200, r.text
    tables = (
        ("memories", "memory_id", "NOT tombstoned"),
        ("memory_evidence", "evidence_id", "NOT tombstoned AND NOT high_sensitivity"),
    )
    current, at = store.live(None, utcnow())  # the current facts (a superseded one is not)
    tables = ((tables[0][0], tables[0][1], current), tables[1])
    for scope in (store.Scope(ns, "u1"), store.Scope(ns, "u1", session_id="s1")):
        for query in ("coffee garden", "kyoto coffee cello", "ledger"):
            for table, id_col, live in tables:
                ref = services.ch.query(
                    store.bm25_sql(table, id_col, live).replace("{scope}", scope.where()),
                    parameters=scope.params() | {"q": query, "lim": 50, "stop": bm25.stop_words_param()} | at,
                ).result_rows
                got = store.bm25(
                    services.ch,
                    scope,
                    query,
                    limit=50,
                    source=ev_store.LEXICAL if table == "memory_evidence" else None,
                )
                assert [h.id for h in got] == [row[0] for row in ref if row[1] > 0], (table, query)
                for h, (_, score, matched) in zip(got, ref, strict=False):
                    assert abs(h.score - score) < 1e-9 and sorted(h.matched) == sorted(matched)
                assert got or table == "memory_evidence" or query == "ledger" and scope.session_id
    # The one-read path (loom.store.memory_scan, evidence's _scan) answers what the
    # server-side legs answer, over the same corpus.
    from loom.store import memory_scan

    for scope in (store.Scope(ns, "u1"), store.Scope(ns, "u1", session_id="s1")):
        for query in ("coffee garden", "kyoto coffee cello", "ledger", "?!"):
            found = memory_scan.scan(services.ch, scope, query, cap=100)
            assert found is not None
            facts = found.facts
            assert facts and all(not f.tombstoned and f.text and f.namespace == ns for f in facts)
            assert memory_scan.scan(services.ch, scope, query, cap=len(facts) - 1) is None
            _same_lexical(
                memory_scan.lexical(found, limit=50), store.bm25(services.ch, scope, query, limit=50)
            )
            emb = await inline.embed(services, [query])
            assert emb.vectors
            for floor in (-1.0, 0.0, 0.2):
                got_v = memory_scan.vector(found, emb.vectors[0], emb.model_id, limit=3, min_similarity=floor)
                ref_v = store.vector_search(
                    services.ch, scope, emb.vectors[0], emb.model_id, limit=3, min_similarity=floor
                )
                assert [h.memory_id for h in got_v] == [h.memory_id for h in ref_v], (query, floor)
                assert all(abs(a.similarity - b.similarity) < 1e-5 for a, b in zip(got_v, ref_v, strict=True))
            assert (
                memory_scan.vector(found, emb.vectors[0], "another-model", limit=3, min_similarity=-1) == []
            )
            got_e = ev_store.scan_search(services.ch, scope, query, limit=50, cap=100)
            ref_e = store.bm25(services.ch, scope, query, limit=50, source=ev_store.LEXICAL)
            assert got_e is not None
            assert [(e.evidence_id, round(s, 9), sorted(m)) for e, s, m in got_e] == [
                (h.id, round(h.score, 9), sorted(h.matched)) for h in ref_e if not h.row.high_sensitivity
            ]
            assert all(e.content for e, _, _ in got_e)
            if got_e:
                assert ev_store.scan_search(services.ch, scope, query, limit=50, cap=0) is None


def _same_lexical(got: list[Any], ref: list[Any]) -> None:
    assert [h.id for h in got] == [h.id for h in ref]
    for a, b in zip(got, ref, strict=True):
        assert abs(a.score - b.score) < 1e-9 and sorted(a.matched) == sorted(b.matched)
        assert a.row == b.row


async def test_a_scope_above_the_one_read_cap_is_ranked_by_the_server_alike(
    call, ns, mint, services, monkeypatch
):
    """Above facts.SCAN_MAX_FACTS (or evidence.SCAN_MAX_ROWS) a scope is ranked by the
    server-side legs, with the same answer; the scope is then remembered as large."""
    from loom.ops.memory import facts as fact_ops
    from loom.ops.memory.common import large_scopes, search_evidence
    from loom.store import evidence as ev_store
    from loom.store import memories as store

    w = mint(ns, "writer")
    await _set(
        call,
        w,
        ns,
        {"text": "Drinks coffee every morning in Kyoto"},
        {"text": "Grows coffee plants in the garden"},
        {"text": "Plays the cello"},
        {"text": "Keeps the coffee ledger"},
        user_id="u1",
    )
    gone = await _set(call, w, ns, {"text": "coffee coffee coffee"}, user_id="u1")
    await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[gone[0]["memory_id"]])
    r = await call(
        "memory.set_from_messages",
        w,
        namespace=ns,
        user_id="u1",
        messages=[{"role": "user", "content": f"coffee in the garden {i}"} for i in range(4)],
    )
    assert r.status_code == 200, r.text
    scope = store.Scope(ns, "u1")

    async def answers() -> tuple[Any, Any]:
        got = await fact_ops.hybrid(services, scope, "coffee garden", limit=10)
        ev = await search_evidence(services, scope, "coffee garden", limit=10)
        return [(h.fact.memory_id, h.score, h.legs) for h in got.hits], [(e.evidence_id, s) for e, s, _ in ev]

    one_read = await answers()
    assert len(one_read[0]) == 3 and len(one_read[1]) == 4  # the cello holds neither word
    assert scope not in large_scopes(services, "facts") and scope not in large_scopes(services, "evidence")
    monkeypatch.setattr(fact_ops, "SCAN_MAX_FACTS", 3)
    monkeypatch.setattr(ev_store, "SCAN_MAX_ROWS", 3)
    assert await answers() == one_read
    assert scope in large_scopes(services, "facts") and scope in large_scopes(services, "evidence")
    monkeypatch.setattr(fact_ops, "SCAN_MAX_FACTS", 0)
    monkeypatch.setattr(ev_store, "SCAN_MAX_ROWS", 0)
    assert await answers() == one_read
