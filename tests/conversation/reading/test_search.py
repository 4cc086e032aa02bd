"""conversation.search: ranking, the floor, filters, fan-out, excerpts, sensitivity,
tombstones, failed embeds, the substring fallback, both ranking strategies, auth and
validation.

The suite's embedder is the deterministic bag-of-words fake (worker and API alike), so a
query shares words with the turn it should find: cosine = shared words / norms. One test
runs the real MiniLM model on a true paraphrase.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.ops.conversation.reading import searching
from loom.ops.embedding import inline
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from loom.store import clickhouse
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store.clickhouse import INDEX_ON_INSERT_MIN_ROWS
from loom.store.search import Filters
from tests.conversation.helpers import emb_row, merges_stopped, parts_indexed, raise_marks, tombstone_turn

DEPLOY = "we rolled back the staging cluster deploy after the canary failed"
BILLING = "the invoice export job now writes to the new ledger every night"
COOKING = "grandma's lasagna needs fresh basil and a slow oven"
PIN = "my PIN is 4821"


async def _append(
    call: Any, token: str, ns: str, turns: list[dict[str, Any]], agent: str = "default"
) -> None:
    r = await call("conversation.append", token, namespace=ns, agent=agent, turns=turns)
    assert r.status_code == 200, r.text
    assert all(x["stored"] for x in r.json()["results"]), r.text


def _turn(thread_id: str, msg_id: str, content: str, role: str = "user", **kw: Any) -> dict[str, Any]:
    return {"thread_id": thread_id, "msg_id": msg_id, "role": role, "content": content, **kw}


async def _search(call: Any, token: str, **body: Any) -> dict[str, Any]:
    r = await call("conversation.search", token, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _ids(body: dict[str, Any]) -> list[str]:
    return [h["msg_id"] for h in body["hits"]]


def _who(*namespaces: str) -> Principal:
    return Principal("test", tuple(namespaces), Role.viewer)


async def _basic(call: Any, writer: str, ns: str) -> None:
    await _append(
        call,
        writer,
        ns,
        [
            _turn("ops", "deploy", DEPLOY, run_id="r1"),
            _turn("ops", "billing", BILLING, role="assistant", run_id="r2"),
            _turn("home", "cooking", COOKING),
            _turn("ops", "tool", "staging cluster deploy log: 42 lines", role="tool"),
            _turn("ops", "sys", "You are the staging cluster deploy assistant", role="system"),
        ],
    )


# -- ranking, floor, fields -----------------------------------------------------


async def test_the_query_finds_its_turn_first(call, ns, writer, mint):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    body = await _search(call, viewer, query="why did the staging deploy roll back?")
    assert body["mode"] == "vector" and body["fallback_reason"] is None
    assert body["namespaces"] == [ns]
    assert _ids(body)[0] == "deploy"
    hit = body["hits"][0]
    assert hit == {
        **hit,
        "namespace": ns,
        "agent": "default",
        "thread_id": "ops",
        "role": "user",
        "run_id": "r1",
        "user_id": "",
        "excerpt": DEPLOY,
    }
    assert 0.3 <= hit["similarity"] <= 1.0
    assert datetime.fromisoformat(hit["ts"]).tzinfo is not None
    # Tool and plain system turns are never embedded, so never hits, even sharing every word.
    assert "tool" not in _ids(body) and "sys" not in _ids(body)
    sims = [h["similarity"] for h in body["hits"]]
    assert sims == sorted(sims, reverse=True)


async def test_hits_below_the_floor_are_dropped(call, ns, writer, mint, services, other_services):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    # No word in common with any turn: cosine ~0, below 0.30.
    assert (await _search(call, viewer, query="quantum chromodynamics lecture"))["hits"] == []
    # One shared word ("ledger") is enough for a low similarity, under the floor.
    low = await _search(call, viewer, query="ledger quantum chromodynamics lecture notes today")
    assert low["hits"] == []
    relaxed = await searching.search(
        other_services(conversation_search_min_similarity=0.05),
        _who(ns),
        "ledger quantum chromodynamics lecture notes today",
    )
    assert [h.msg_id for h in relaxed.hits] == ["billing"]
    assert relaxed.hits[0].similarity is not None and 0.05 <= relaxed.hits[0].similarity < 0.3
    strict = await searching.search(
        other_services(conversation_search_min_similarity=0.99),
        _who(ns),
        "why did the staging deploy roll back?",
    )
    assert strict.hits == []


async def test_limit(call, ns, writer, mint):
    await _append(
        call, writer, ns, [_turn("t", f"m{i}", f"staging deploy note number {i}") for i in range(15)]
    )
    viewer = mint(ns, "viewer")
    assert len((await _search(call, viewer, query="staging deploy note"))["hits"]) == 10
    assert len((await _search(call, viewer, query="staging deploy note", limit=3))["hits"]) == 3
    assert len((await _search(call, viewer, query="staging deploy note", limit=100))["hits"]) == 15


async def test_minilm_finds_a_paraphrase(call, ns, writer, mint, api_embedder, worker_embedder):
    from loom.providers.embedders import build_embedder

    model = build_embedder("minilm")
    api_embedder(model)
    worker_embedder(model)
    await _append(
        call,
        writer,
        ns,
        [
            _turn(
                "t",
                "deploy",
                "The release to the staging environment failed because the container image was "
                "missing from the registry, so we reverted it.",
            ),
            _turn(
                "t", "food", "Grandma's lasagna recipe needs fresh basil and a slow oven.", role="assistant"
            ),
            _turn("t", "billing", "Invoices are exported to the new accounting ledger every night."),
        ],
    )
    body = await _search(call, mint(ns, "viewer"), query="why did the staging rollout break?")
    assert body["mode"] == "vector"
    assert _ids(body)[0] == "deploy"
    assert "food" not in _ids(body)


# -- filters and fan-out ----------------------------------------------------------


async def test_filters_thread_run_role_and_agent(call, ns, writer, mint, services):
    words = "staging cluster deploy rollback"
    await _append(
        call,
        writer,
        ns,
        [
            _turn("a", "a-user", f"{words} one", run_id="r1"),
            _turn("a", "a-asst", f"{words} two", role="assistant", run_id="r2"),
            _turn("b", "b-user", f"{words} three", run_id="r1"),
        ],
    )
    await _append(call, writer, ns, [_turn("c", "c-bot", f"{words} four")], agent="bot-2")
    _summary(services, ns, "a", "a-sum", f"summary: {words} five")
    viewer = mint(ns, "viewer")

    async def ids(**filters: Any) -> set[str]:
        return set(_ids(await _search(call, viewer, query=words, **filters)))

    assert await ids() == {"a-user", "a-asst", "b-user", "c-bot", "a-sum"}
    assert await ids(thread_id="a") == {"a-user", "a-asst", "a-sum"}
    assert await ids(run_id="r1") == {"a-user", "b-user"}
    assert await ids(role="assistant") == {"a-asst"}
    assert await ids(role="system") == {"a-sum"}  # compaction summaries
    assert await ids(agent="bot-2") == {"c-bot"}
    assert await ids(agent="*") == await ids()
    assert await ids(agent="default", thread_id="a", role="user", run_id="r1") == {"a-user"}
    assert await ids(thread_id="nope") == set()
    body = await _search(call, viewer, query=words, agent="bot-2")
    assert body["hits"][0]["agent"] == "bot-2" and body["hits"][0]["thread_id"] == "c"


def _summary(services: Any, ns: str, thread_id: str, msg_id: str, text: str) -> None:
    """A compaction summary as compaction writes it: an embedded system turn."""
    now = datetime.now(UTC)
    version = next_version()
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                ns, "default", thread_id, msg_id, now, "system", text, is_summary=True, version=version
            )
        ],
    )
    emb_store.insert(
        services.ch,
        [
            emb_store.EmbeddingRow(
                ns,
                thread_id,
                msg_id,
                "default",
                "system",
                "",
                "",
                now,
                text,
                FakeEmbedder().vector(text),
                "fake-hash-384",
                is_summary=True,
                version=version,
            )
        ],
    )


async def test_fans_out_over_the_tokens_namespaces(call, ns, writer, mint, recording):
    other = ns + "b"
    recording(other, True)
    await _append(call, writer, ns, [_turn("t", "here", DEPLOY)])
    await _append(call, mint(other, "writer"), other, [_turn("t", "there", DEPLOY + " again")])
    both = mint([ns, other], "viewer")
    body = await _search(call, both, query="staging deploy rolled back")
    assert body["namespaces"] == [ns, other]
    assert {(h["namespace"], h["msg_id"]) for h in body["hits"]} == {(ns, "here"), (other, "there")}
    one = await _search(
        call, both, query="staging deploy rolled back", namespace_scope="one", namespace=other
    )
    assert one["namespaces"] == [other]
    assert [(h["namespace"], h["msg_id"]) for h in one["hits"]] == [(other, "there")]
    # A token of one namespace searches only that one.
    body = await _search(call, mint(ns, "viewer"), query="staging deploy rolled back")
    assert body["namespaces"] == [ns] and _ids(body) == ["here"]


# -- excerpts -----------------------------------------------------------------------


async def test_excerpt_is_the_start_of_the_turn_and_follows_the_setting(
    call, ns, writer, mint, other_services
):
    long = "staging deploy " + "é" * 300 + " tail words " + "x" * 3000
    await _append(call, writer, ns, [_turn("t", "long", long), _turn("t", "short", "staging deploy short")])
    body = await _search(call, mint(ns, "viewer"), query="staging deploy")
    excerpts = {h["msg_id"]: h["excerpt"] for h in body["hits"]}
    assert excerpts == {"long": long[:240], "short": "staging deploy short"}
    for chars in (20, 2_000, 5_000):  # 5,000 is past the 2,048 the embedding row keeps
        result = await searching.search(
            other_services(conversation_search_excerpt_chars=chars), _who(ns), "staging deploy"
        )
        assert {h.msg_id: h.excerpt for h in result.hits}["long"] == long[:chars]


async def test_a_legacy_240_character_row_shows_the_turn(call, ns, writer, services, other_services):
    """Rows of earlier builds keep 240 characters; a longer excerpt comes from the turn."""
    content = "staging deploy " + "y" * 600
    await _append(call, writer, ns, [_turn("t", "m", content)])
    row = emb_store.get(services.ch, ns, "t", "m")
    assert row is not None
    row.text, row.version = content[:240], next_version()
    emb_store.insert(services.ch, [row])
    raise_marks(services.ch, ns)  # as migration 006 did for rows of earlier builds
    result = await searching.search(services, _who(ns), "staging deploy")
    assert [h.excerpt for h in result.hits] == [content[:240]]
    wide = await searching.search(
        other_services(conversation_search_excerpt_chars=400), _who(ns), "staging deploy"
    )
    assert [h.excerpt for h in wide.hits] == [content[:400]]


# -- sensitivity --------------------------------------------------------------------


async def test_high_turns_are_never_returned(call, ns, writer, mint, services, api_embedder):
    viewer = mint(ns, "viewer")
    secret = "staging deploy password=Tr0ub4dor&3xq"
    await _append(call, writer, ns, [_turn("t", "high", secret), _turn("t", "plain", "staging deploy done")])
    # An earlier build's row: embedded, not marked, a secret past the excerpt but within 1,024 more.
    past = "staging deploy notes " + "z " * 200 + " password=Tr0ub4dor&3xq"
    _unmarked_embedded(services, ns, "t", "late", past)
    # And one marked high that an earlier build embedded anyway.
    _unmarked_embedded(services, ns, "t", "marked", "staging deploy marked", high=True)
    body = await _search(call, viewer, query="staging deploy notes marked")
    assert set(_ids(body)) == {"plain"}
    api_embedder(FakeEmbedder(fail=True))
    body = await _search(call, viewer, query="staging deploy")
    assert body["mode"] == "substring"
    assert set(_ids(body)) == {"plain"}
    body = await _search(call, viewer, query="Tr0ub4dor")
    assert body["mode"] == "substring" and body["hits"] == []


def _unmarked_embedded(
    services: Any, ns: str, thread_id: str, msg_id: str, text: str, high: bool = False
) -> None:
    now = datetime.now(UTC)
    version = next_version()
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                ns, "default", thread_id, msg_id, now, "user", text, high_sensitivity=high, version=version
            )
        ],
    )
    emb_store.insert(
        services.ch,
        [
            emb_store.EmbeddingRow(
                ns,
                thread_id,
                msg_id,
                "default",
                "user",
                "",
                "",
                now,
                text[:2048],
                FakeEmbedder().vector(text[:2048]),
                "fake-hash-384",
                version=version,
            )
        ],
    )
    raise_marks(services.ch, ns)  # as migration 006 did for rows of earlier builds


@pytest.mark.parametrize("query", [PIN, "staging deploy, sk-proj-4fJ9kQ2mZx8LwP1vN7bR3tY6uH0eD5sA"])
async def test_a_high_query_never_reaches_the_embedder(call, ns, writer, mint, api_embedder, query):
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    await _append(call, writer, ns, [_turn("t", "plain", "staging deploy done")])
    body = await _search(call, mint(ns, "viewer"), query=query)
    assert body["mode"] == "substring" and body["fallback_reason"] == "query_high_sensitivity"
    assert spy.calls == []
    await _search(call, mint(ns, "viewer"), query="staging deploy")
    assert spy.texts == ["staging deploy"]


# -- deletion, re-embedding, failed embeds ------------------------------------------------


async def test_tombstoned_turns_and_embeddings_never_appear(call, ns, writer, mint, services, api_embedder):
    await _append(call, writer, ns, [_turn("t", f"m{i}", f"staging deploy report {i}") for i in range(4)])
    viewer = mint(ns, "viewer")
    tombstone_turn(services.ch, ns, "default", "t", "m0")  # the transcript row
    raise_marks(services.ch, ns)  # as deletion does
    row = emb_store.get(services.ch, ns, "t", "m1")  # the embedding row, vector kept
    assert row is not None
    row.tombstoned, row.version = True, next_version()
    emb_store.insert(services.ch, [row])
    row = emb_store.get(services.ch, ns, "t", "m2")  # ... and without its vector
    assert row is not None
    row.tombstoned, row.embedding, row.version = True, [], next_version()
    emb_store.insert(services.ch, [row])
    body = await _search(call, viewer, query="staging deploy report")
    assert _ids(body) == ["m3"]
    api_embedder(FakeEmbedder(fail=True))
    body = await _search(call, viewer, query="staging deploy report")
    assert body["mode"] == "substring"
    assert set(_ids(body)) == {"m1", "m2", "m3"}  # the transcript rows of m1/m2 are live


async def test_a_re_embedded_row_is_found_by_its_new_vector_only(call, ns, writer, mint, services):
    await _append(call, writer, ns, [_turn("t", "m", "staging deploy report")])
    row = emb_store.get(services.ch, ns, "t", "m")
    assert row is not None
    raise_marks(services.ch, ns)
    row.embedding, row.version = FakeEmbedder().vector("lasagna basil oven"), next_version()
    emb_store.insert(services.ch, [row])  # the old vector stays in the index until a merge
    viewer = mint(ns, "viewer")
    assert (await _search(call, viewer, query="staging deploy report"))["hits"] == []
    body = await _search(call, viewer, query="lasagna basil oven")
    assert _ids(body) == ["m"] and body["hits"][0]["similarity"] == pytest.approx(1.0, abs=1e-5)
    # Re-embedded again, close to the first text: the stale vector ranks first, the live one still counts.
    raise_marks(services.ch, ns)  # as every re-embed does (loom.store.search_marks)
    row.embedding, row.version = FakeEmbedder().vector("staging deploy report again"), next_version()
    emb_store.insert(services.ch, [row])
    body = await _search(call, viewer, query="staging deploy report")
    assert _ids(body) == ["m"]
    assert body["hits"][0]["similarity"] == pytest.approx(3 / (np.sqrt(3) * 2), abs=1e-5)


async def test_failed_embeds_are_found_only_by_substring(
    call, ns, writer, mint, services, worker_embedder, api_embedder
):
    worker_embedder(FakeEmbedder(fail=True))
    await _append(call, writer, ns, [_turn("t", "failed", "staging deploy report that failed to embed")])
    assert emb_row(services.ch, ns, "t", "failed")["error"] != ""
    worker_embedder(FakeEmbedder())
    await _append(call, writer, ns, [_turn("t", "ok", "staging deploy report")])
    viewer = mint(ns, "viewer")
    body = await _search(call, viewer, query="staging deploy report that failed to embed")
    assert body["mode"] == "vector" and _ids(body) == ["ok"]
    api_embedder(FakeEmbedder(fail=True))
    body = await _search(call, viewer, query="FAILED to EMBED")
    assert body["mode"] == "substring" and body["fallback_reason"] == "embedder_error"
    assert _ids(body) == ["failed"] and body["hits"][0]["similarity"] is None


# -- the substring fallback -----------------------------------------------------------------


async def test_an_unavailable_embedder_falls_back_to_substring(
    call, ns, writer, mint, api_embedder, other_services
):
    await _basic(call, writer, ns)
    await _append(
        call, writer, ns, [_turn("home", "summary-like", "Staging notes", role="assistant", run_id="r9")]
    )
    viewer = mint(ns, "viewer")
    api_embedder(FakeEmbedder(fail=True))
    body = await _search(call, viewer, query="STAGING")
    assert body["mode"] == "substring" and body["fallback_reason"] == "embedder_error"
    # Newest first; tool and plain system turns are not searched.
    assert _ids(body) == ["summary-like", "deploy"]
    assert body["hits"][1]["excerpt"] == DEPLOY and body["hits"][1]["similarity"] is None
    assert _ids(await _search(call, viewer, query="staging", run_id="r1")) == ["deploy"]
    assert _ids(await _search(call, viewer, query="staging", thread_id="home")) == ["summary-like"]
    assert _ids(await _search(call, viewer, query="staging", role="assistant")) == ["summary-like"]
    assert _ids(await _search(call, viewer, query="staging", limit=1)) == ["summary-like"]
    assert (await _search(call, viewer, query="staging", agent="nobody"))["hits"] == []
    assert (await _search(call, viewer, query="%"))["hits"] == []  # no LIKE pattern
    svc = other_services(embedder_timeout_seconds=0.2)  # a process of its own: its own inline embedder
    inline.install(svc, FakeEmbedder(delay_seconds=1.0))
    slow = await searching.search(svc, _who(ns), "staging")
    assert slow.mode == "substring" and slow.fallback_reason == "embedder_timeout"
    assert [h.msg_id for h in slow.hits] == ["summary-like", "deploy"]


# -- strategies: exact scan and HNSW index ---------------------------------------------------


async def test_exact_and_index_strategies_agree(call, ns, writer, mint, other_services):
    texts = [
        f"staging cluster deploy {w} {i}" for i, w in enumerate(["alpha", "beta", "gamma", "delta"] * 10)
    ]
    await _append(call, writer, ns, [_turn(f"t{i % 3}", f"m{i}", t) for i, t in enumerate(texts)])
    who = _who(ns)
    exact = await searching.search(
        other_services(conversation_search_exact_max_rows=1_000_000), who, "staging deploy gamma", limit=8
    )
    index = await searching.search(
        other_services(conversation_search_exact_max_rows=0), who, "staging deploy gamma", limit=8
    )
    assert exact.plan == ["exact"] and index.plan == ["index"]
    assert len(exact.hits) == 8
    assert [(h.msg_id, h.similarity) for h in index.hits] == [(h.msg_id, h.similarity) for h in exact.hits]
    filtered = Filters(thread_id="t1", role="user")
    a = await searching.search(
        other_services(conversation_search_exact_max_rows=1_000_000), who, "staging gamma", filters=filtered
    )
    b = await searching.search(
        other_services(conversation_search_exact_max_rows=0), who, "staging gamma", filters=filtered
    )
    assert [h.msg_id for h in a.hits] == [h.msg_id for h in b.hits] and a.hits
    assert all(h.thread_id == "t1" for h in a.hits)


@pytest.mark.parametrize("index_on_insert_min_rows", [INDEX_ON_INSERT_MIN_ROWS, 2])
async def test_small_inserts_leave_the_index_to_merges_and_are_found_before_and_after(
    call, ns, writer, services, other_services, monkeypatch, index_on_insert_min_rows
):
    """Appends leave the HNSW index to merges (building it per insert cost more than the
    rest of the insert): a fresh part is scanned exactly, a merged one through the index.
    An insert of INDEX_ON_INSERT_MIN_ROWS rows or more builds its own."""
    monkeypatch.setattr(clickhouse, "INDEX_ON_INSERT_MIN_ROWS", index_on_insert_min_rows)
    texts = [
        f"staging cluster deploy {w} {i}" for i, w in enumerate(["alpha", "beta", "gamma", "delta"] * 10)
    ]
    who = _who(ns)

    async def both() -> tuple[list[Any], list[Any]]:
        exact = await searching.search(
            other_services(conversation_search_exact_max_rows=1_000_000), who, "staging deploy gamma", limit=8
        )
        index = await searching.search(
            other_services(conversation_search_exact_max_rows=0), who, "staging deploy gamma", limit=8
        )
        assert exact.plan == ["exact"] and index.plan == ["index"]
        return (
            [(h.msg_id, h.similarity) for h in exact.hits],
            [(h.msg_id, h.similarity) for h in index.hits],
        )

    with merges_stopped(services.ch, "conversation_vectors_384"):
        await _append(call, writer, ns, [_turn(f"t{i % 3}", f"m{i}", t) for i, t in enumerate(texts)])
        indexed = parts_indexed(services.ch, "conversation_vectors_384", ns)
        exact, index = await both()
    assert indexed and set(indexed) == {index_on_insert_min_rows <= len(texts)}
    assert len(exact) == 8 and index == exact
    services.ch.command("OPTIMIZE TABLE conversation_vectors_384 FINAL")
    assert all(parts_indexed(services.ch, "conversation_vectors_384", ns))
    assert await both() == (exact, exact)


async def test_both_strategies_in_one_fan_out(call, ns, writer, mint, recording, other_services):
    big, small = ns, ns + "s"
    recording(small, True)
    await _append(call, writer, big, [_turn("t", f"b{i}", f"staging deploy big {i}") for i in range(12)])
    await _append(call, mint(small, "writer"), small, [_turn("t", "s0", "staging deploy small")])
    result = await searching.search(
        other_services(conversation_search_exact_max_rows=5),
        _who(big, small),
        "staging deploy small",
        limit=3,
    )
    assert result.plan == ["exact", "index"]
    assert result.hits[0].msg_id == "s0" and result.hits[0].namespace == small
    assert len(result.hits) == 3


async def test_planner_counts_are_reused_but_an_empty_namespace_is_counted_again(
    call, ns, writer, services, monkeypatch
):
    """The planner's counts are cached for a few seconds (a stale count only changes the
    strategy); a namespace counted empty is skipped, so that count is never reused."""
    from loom.store import search as search_store

    calls = []
    real = search_store.counts

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(search_store, "counts", counting)
    who = _who(ns)
    assert (await searching.search(services, who, "staging deploy rolled back")).hits == []
    await _append(call, writer, ns, [_turn("t", "m", DEPLOY)])
    first = await searching.search(services, who, "staging deploy rolled back")
    assert [h.msg_id for h in first.hits] == ["m"]  # found at once: the empty count was not reused
    n = len(calls)
    again = await searching.search(services, who, "why was the staging deploy rolled back")
    assert [h.msg_id for h in again.hits] == ["m"] and len(calls) == n  # a non-empty count is reused


@pytest.mark.parametrize("exact_max_rows", [1_000_000, 0])
async def test_dead_candidates_are_refetched(
    call, ns, writer, mint, services, other_services, exact_max_rows
):
    """The first fetch (limit * 2 + 10) is all tombstoned: the search fetches again."""
    await _append(
        call,
        writer,
        ns,
        [_turn("t", f"m{i:02d}", "staging deploy report " + "word " * (i // 10)) for i in range(40)],
    )
    for i in range(30):
        tombstone_turn(services.ch, ns, "default", "t", f"m{i:02d}")
    result = await searching.search(
        other_services(conversation_search_exact_max_rows=exact_max_rows),
        _who(ns),
        "staging deploy report",
        limit=2,
    )
    assert len(result.hits) == 2
    assert all(h.msg_id >= "m30" for h in result.hits)


async def test_dead_best_candidates_are_replaced_by_the_next_ones_in_order(
    call, ns, writer, mint, services, other_services
):
    """The best limit + VERIFY_SPARE candidates are verified first; when dead ones leave
    too few hits, the rest of the fetch is verified and the order still holds."""
    await _append(call, writer, ns, [_turn("t", f"m{i:02d}", "staging deploy report") for i in range(10)])
    for i in range(5):
        tombstone_turn(services.ch, ns, "default", "t", f"m{i:02d}")
    result = await searching.search(
        other_services(conversation_search_exact_max_rows=10_000), _who(ns), "staging deploy report", limit=3
    )
    assert [h.msg_id for h in result.hits] == ["m05", "m06", "m07"]


async def test_a_dimension_without_a_vector_table_is_scanned_exactly(
    call, ns, writer, mint, api_embedder, worker_embedder
):
    api_embedder(FakeEmbedder(dim=64))
    worker_embedder(FakeEmbedder(dim=64))
    await _append(call, writer, ns, [_turn("t", "m", DEPLOY), _turn("t", "n", COOKING)])
    r = await call("conversation.search", mint(ns, "viewer"), query="staging deploy rolled back")
    assert r.status_code == 200 and r.headers["x-loom-search-plan"] == "exact_unindexed"
    assert _ids(r.json()) == ["m"]


async def test_the_vector_table_follows_the_embedding_table(call, ns, writer, services):
    """Every vector written to conversation_embeddings reaches the index table, and only live ones."""
    await _append(call, writer, ns, [_turn("t", "m", DEPLOY), _turn("t", "x", "x", role="tool")])
    rows = services.ch.query(
        "SELECT msg_id, version, length(embedding), text FROM conversation_vectors_384 "
        "WHERE namespace = {ns:String}",
        parameters={"ns": ns},
    ).result_rows
    emb = emb_row(services.ch, ns, "t", "m")
    assert rows == [("m", emb["version"], 384, DEPLOY)]
    assert np.allclose(FakeEmbedder().vector(DEPLOY), emb["embedding"], atol=1e-6)


# -- auth and validation --------------------------------------------------------------


async def test_roles_and_scopes(call, ns, mint, recording):
    recording(ns, True)
    for role in ("viewer", "writer", "admin"):
        r = await call("conversation.search", mint(ns, role), query="anything")
        assert r.status_code == 200, (role, r.text)
    for scope, extra in (("own_user", {"read_user_id": "u1"}), ("own_session", {"read_session_id": "s1"})):
        token = mint(ns, "viewer", read_scope=scope, **extra)
        for body in (
            {},
            {"namespace_scope": "one", "namespace": ns},
            {"namespace_scope": "one", "namespace": "@me"},
        ):
            r = await call("conversation.search", token, query="anything", **body)
            assert r.status_code == 403 and r.json()["rule"] == "read_scope", r.text
    r = await call(
        "conversation.search", mint(ns, "viewer"), query="x", namespace_scope="one", namespace=ns + "x"
    )
    assert r.status_code == 403 and r.json()["field"] == "namespace"
    r = await call("conversation.search", None, query="x")
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "q" * 4_001}, "query"),
        ({"query": "q", "limit": 0}, "limit"),
        ({"query": "q", "limit": 101}, "limit"),
        ({"query": "q", "role": "tool"}, "role"),
        ({"query": "q", "namespace_scope": "everything"}, "namespace_scope"),
        ({"query": "q", "agent": "bad agent"}, "agent"),
        ({"query": "q", "thread_id": ""}, "thread_id"),
        ({"query": "q", "surprise": 1}, "surprise"),
    ],
)
async def test_bad_input_is_a_4xx_naming_field_and_rule(call, ns, mint, body, field):
    r = await call("conversation.search", mint(ns, "viewer"), **body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["field"] == field and r.json()["rule"]


async def test_scope_and_namespace_must_agree(call, ns, mint):
    viewer = mint(ns, "viewer")
    r = await call("conversation.search", viewer, query="q", namespace_scope="one")
    assert r.status_code == 422 and r.json()["field"] == "namespace"
    assert r.json()["rule"] == "required_with_scope_one"
    # "all_mine" searches every namespace the token grants: naming one beside it contradicts it.
    r = await call("conversation.search", viewer, query="q", namespace_scope="all_mine", namespace=ns)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["rule"] == "namespace_with_all_mine"
    assert r.json()["fields"] == ["namespace_scope", "namespace"] and r.json()["field"] == "namespace_scope"
    assert "namespace_scope" in r.json()["message"] and "namespace" in r.json()["message"]
    assert (await _search(call, viewer, query="q" * 4_000))["hits"] == []


async def test_a_named_namespace_is_searched_alone_and_none_fans_out(call, ns, writer, mint, recording):
    """namespace_scope left out: a body naming `namespace` searches that one namespace;
    one naming none searches every namespace the token grants. Both say which."""
    other = ns + "b"
    recording(other, True)
    await _append(call, writer, ns, [_turn("t", "here", DEPLOY)])
    await _append(call, mint(other, "writer"), other, [_turn("t", "there", DEPLOY + " again")])
    both = mint([ns, other], "viewer")
    one = await _search(call, both, query="staging deploy rolled back", namespace=other)
    assert one["namespaces"] == [other]
    assert [(h["namespace"], h["msg_id"]) for h in one["hits"]] == [(other, "there")]
    one = await _search(call, both, query="staging deploy rolled back", namespace=ns)
    assert one["namespaces"] == [ns] and _ids(one) == ["here"]
    fanned = await _search(call, both, query="staging deploy rolled back")
    assert fanned["namespaces"] == [ns, other]
    assert {(h["namespace"], h["msg_id"]) for h in fanned["hits"]} == {(ns, "here"), (other, "there")}
    explicit = await _search(call, both, query="staging deploy rolled back", namespace_scope="all_mine")
    assert explicit["namespaces"] == [ns, other] and len(explicit["hits"]) == 2
    # A named namespace the token does not grant is refused, not widened or ignored.
    r = await call("conversation.search", mint(ns, "viewer"), query="staging deploy", namespace=other)
    assert r.status_code == 403 and r.json()["field"] == "namespace"
