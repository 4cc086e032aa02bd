"""conversation.search's lexical and hybrid modes (migration 016's postings): ranking,
legs, the floor in hybrid mode, stop-words and stems, and every rule the vector leg
keeps: tombstones (delete, delete_message, compaction), high turns (never indexed),
saved-only rows, redaction, scope (namespaces, agent, filters), validation.

The suite's embedder is the bag-of-words fake, so the vector leg finds turns sharing
words with the query; the tests below pick queries whose words only the lexical leg can
use (stems, stop-words, turns under the floor)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.errors import InvalidRequest
from loom.ops.conversation.reading import searching
from loom.store import transcript_terms
from loom.store.search import Filters
from tests.conversation.helpers import append_turn, ok, save, turn_rows

DOG = "my border collie Pip chews every shoe in the house when it rains"
TRIP = "we booked the flights to Lisbon for the conference in early March"
GARDEN = "the tomatoes in the greenhouse need watering twice a day in summer"
LONG = ("filler words about nothing in particular " * 60) + "the router password is kept in the blue binder"


def _turn(thread_id: str, msg_id: str, content: str, role: str = "user", **kw: Any) -> dict[str, Any]:
    return {"thread_id": thread_id, "msg_id": msg_id, "role": role, "content": content, **kw}


async def _append(call: Any, token: str, ns: str, turns: list[dict[str, Any]], agent: str = "default") -> Any:
    r = await call("conversation.append", token, namespace=ns, agent=agent, turns=turns)
    assert r.status_code == 200, r.text
    return r.json()


async def _search(call: Any, token: str, **body: Any) -> dict[str, Any]:
    return await ok(call, "conversation.search", token, **body)


def _ids(body: dict[str, Any]) -> list[str]:
    return [h["msg_id"] for h in body["hits"]]


async def _basic(call: Any, writer: str, ns: str) -> None:
    await _append(
        call,
        writer,
        ns,
        [
            _turn("home", "dog", DOG),
            _turn("travel", "trip", TRIP, role="assistant", run_id="r1"),
            _turn("home", "garden", GARDEN),
            _turn("home", "long", LONG),
            _turn("ops", "tool", "collie shoe log", role="tool"),
            _turn("ops", "sys", "You are a collie expert", role="system"),
        ],
    )


async def test_lexical_mode_ranks_by_bm25_with_stems_and_no_floor(call, ns, writer, mint):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    # "booking" and "flight" are stems of the turn's "booked" and "flights"; "what", "did", "I" are stop-words.
    body = await _search(
        call, viewer, namespace=ns, query="what did I say about booking a flight?", search_mode="lexical"
    )
    assert body["mode"] == "lexical" and body["fallback_reason"] is None
    assert _ids(body) == ["trip"]
    hit = body["hits"][0]
    assert hit["legs"] == ["lexical"] and hit["similarity"] is None and hit["score"] > 0
    assert hit["role"] == "assistant" and hit["run_id"] == "r1" and hit["excerpt"] == TRIP
    # A phrase deep in a long turn still ranks; tool and plain system turns are never indexed.
    deep = await _search(call, viewer, namespace=ns, query="router password binder", search_mode="lexical")
    assert _ids(deep)[0] == "long"
    collie = await _search(call, viewer, namespace=ns, query="collie", search_mode="lexical")
    assert _ids(collie) == ["dog"]


async def test_hybrid_fuses_the_legs_and_the_floor_binds_the_vector_leg_only(call, ns, writer, mint):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    # Shares one word with the dog turn among many others: under the 0.30 floor for the vector leg.
    query = "collie quantum chromodynamics lecture notes physics seminar today"
    vector = await _search(call, viewer, namespace=ns, query=query)
    assert vector["hits"] == []
    hybrid = await _search(call, viewer, namespace=ns, query=query, search_mode="hybrid")
    assert hybrid["mode"] == "hybrid" and _ids(hybrid) == ["dog"]
    assert hybrid["hits"][0]["legs"] == ["lexical"] and hybrid["hits"][0]["similarity"] is None
    both = await _search(call, viewer, namespace=ns, query="border collie chews shoes", search_mode="hybrid")
    assert _ids(both)[0] == "dog"
    assert both["hits"][0]["legs"] == ["vector", "lexical"] and both["hits"][0]["similarity"] >= 0.3
    # lexical_weight 0: the lexical leg no longer counts, only the vector leg's hits remain.
    zero = await _search(call, viewer, namespace=ns, query=query, search_mode="hybrid", lexical_weight=0)
    assert zero["hits"] == []


async def test_a_query_naming_the_speaker_finds_that_speakers_turn(call, ns, writer, mint, services):
    said = "I went to a support group yesterday and it was powerful"
    await _append(
        call,
        writer,
        ns,
        [
            _turn("s", "caroline", said, metadata={"speaker": "Caroline"}),
            _turn(
                "s",
                "melanie",
                "I painted a sunset last week",
                role="assistant",
                metadata={"speaker": "Melanie"},
            ),
            _turn("s", "numbered", "the group met again on Friday", metadata={"speaker": 7}),
            _turn("s", "secret", "my PIN is 4821", metadata={"speaker": "Zorblax"}),  # read as high
        ],
    )
    viewer = mint(ns, "viewer")
    for mode in MODES:
        # "caroline" is only in the speaker: the lexical leg finds her turn by it.
        found = await _search(call, viewer, namespace=ns, query="what did Caroline go to", search_mode=mode)
        assert _ids(found)[0] == "caroline", mode
        assert found["hits"][0]["excerpt"] == said  # the excerpt is the content alone
        assert "lexical" in found["hits"][0]["legs"]
        assert _ids(await _search(call, viewer, namespace=ns, query="Melanie", search_mode=mode)) == [
            "melanie"
        ]
        # A high turn is never indexed, speaker and all; a non-string speaker is ignored.
        zorblax = await _search(call, viewer, namespace=ns, query="Zorblax", search_mode=mode)
        assert all("lexical" not in h["legs"] and h["msg_id"] != "secret" for h in zorblax["hits"])
    assert transcript_terms.postings_of(services.ch, ns, [(ns, "default", "s", "secret")]) == []
    assert "7" not in transcript_terms.postings_of(services.ch, ns, [(ns, "default", "s", "numbered")])
    assert "caroline" in transcript_terms.postings_of(services.ch, ns, [(ns, "default", "s", "caroline")])


async def test_postings_hold_stems_and_never_a_high_turn(call, ns, writer, mint, services):
    await _append(
        call,
        writer,
        ns,
        [
            _turn("t", "plain", "Running meetings"),
            _turn("t", "pin", "my PIN is 4821 and the bank is Zorblax"),
        ],
    )
    assert transcript_terms.postings_of(services.ch, ns, [(ns, "default", "t", "plain")]) == ["meet", "run"]
    assert transcript_terms.postings_of(services.ch, ns, [(ns, "default", "t", "pin")]) == []
    viewer = mint(ns, "viewer")
    for mode in ("lexical", "hybrid"):
        assert (await _search(call, viewer, namespace=ns, query="zorblax 4821", search_mode=mode))[
            "hits"
        ] == []


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("search_mode", "fuzzy", None),
        ("lexical_weight", 1.5, "less_than_equal"),
        ("lexical_weight", 100, "less_than_equal"),
        ("lexical_weight", -0.1, None),
    ],
)
async def test_bad_mode_or_weight_is_a_422_naming_the_field(call, ns, mint, field, value, rule):
    r = await call("conversation.search", mint(ns, "viewer"), namespace=ns, query="x", **{field: value})
    assert r.status_code == 422, r.text
    assert field in r.text
    if rule:
        assert rule in r.text


async def test_lexical_weight_is_the_lexical_legs_share_from_0_to_1(call, ns, writer, mint):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    for weight in (0, 0.5, 0.9, 1):
        body = await _search(
            call, viewer, namespace=ns, query="booked flights", search_mode="hybrid", lexical_weight=weight
        )
        assert _ids(body)[0] == "trip"
        top = body["hits"][0]
        # First in both legs: (1 - w) / 61 from the vector leg, w / 61 from the lexical one.
        assert top["score"] == pytest.approx((1 - weight) / 61 + weight / 61, abs=1e-6)
        assert top["legs"] == ["vector", "lexical"]


MODES = ("lexical", "hybrid")


async def _found(call: Any, token: str, ns: str, query: str, mode: str, **kw: Any) -> list[str]:
    return _ids(await _search(call, token, namespace=ns, query=query, search_mode=mode, **kw))


class _Failing:
    model_id = "failing"
    dim = 384

    def embed(self, texts: Any) -> Any:
        raise RuntimeError("embedder down")


async def test_a_query_that_cannot_be_embedded_is_answered_by_the_lexical_leg(
    call, ns, writer, mint, api_embedder
):
    await _basic(call, writer, ns)
    viewer = mint(ns, "viewer")
    high = await _search(
        call, viewer, namespace=ns, query="my PIN is 4821, border collie", search_mode="hybrid"
    )
    assert high["mode"] == "lexical" and high["fallback_reason"] == "query_high_sensitivity"
    assert _ids(high) == ["dog"]
    api_embedder(_Failing())
    down = await _search(call, viewer, namespace=ns, query="border collie", search_mode="hybrid")
    assert down["mode"] == "lexical" and down["fallback_reason"] == "embedder_error" and _ids(down) == ["dog"]
    # Vector mode keeps its substring fallback.
    vector = await _search(call, viewer, namespace=ns, query="border collie")
    assert vector["mode"] == "substring"


@pytest.mark.parametrize("mode", MODES)
async def test_a_deleted_thread_is_never_found(mode, call, ns, writer, mint):
    await _basic(call, writer, ns)
    admin = mint(ns, "admin")
    assert await _found(call, admin, ns, "border collie", mode) == ["dog"]
    await ok(call, "conversation.delete", admin, namespace=ns, thread_id="home", confirm_thread_id="home")
    assert await _found(call, admin, ns, "border collie", mode) == []
    assert await _found(call, admin, ns, "booked flights", mode) == ["trip"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_deleted_message_is_never_found_and_its_postings_leave(
    mode, call, ns, writer, mint, services
):
    await _basic(call, writer, ns)
    admin = mint(ns, "admin")
    key = (ns, "default", "home", "dog")
    assert transcript_terms.postings_of(services.ch, ns, [key])
    got = await ok(call, "conversation.delete_message", admin, namespace=ns, thread_id="home", msg_id="dog")
    assert got["tables"]["conversation_terms"]["removed"] > 0
    assert transcript_terms.postings_of(services.ch, ns, [key]) == []
    assert await _found(call, admin, ns, "border collie", mode) == []


async def test_a_redacted_turn_is_found_by_its_new_words_only(call, ns, writer, mint, services):
    await _basic(call, writer, ns)
    admin = mint(ns, "admin")
    await ok(
        call,
        "conversation.redact",
        admin,
        namespace=ns,
        thread_id="home",
        msg_id="dog",
        spans=["border collie Pip"],
        placeholder="[pet]",
    )
    for mode in MODES:
        assert await _found(call, admin, ns, "collie", mode) == [], mode
        assert await _found(call, admin, ns, "chews shoes", mode) == ["dog"], mode
    terms = transcript_terms.postings_of(services.ch, ns, [(ns, "default", "home", "dog")])
    assert "collie" not in terms and "shoe" in terms


@pytest.mark.parametrize("mode", MODES)
async def test_compacted_turns_are_never_found_and_the_summary_is(
    mode,
    call,
    ns,
    writer,
    services,
    summarizer,
):
    turns = [
        {
            "thread_id": "t",
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: zephyr{i} notes",
        }
        for i in range(16)
    ]
    got = await ok(call, "conversation.append", writer, namespace=ns, agent="a", turns=turns)
    ids = [r["msg_id"] for r in got["results"]]
    assert await _found(call, writer, ns, "zephyr2", mode) == [ids[2]]
    done = await ok(call, "conversation.compact", writer, namespace=ns, agent="a", thread_id="t")
    assert done["messages_summarized"] == 6
    for i in range(6):
        assert ids[i] not in await _found(call, writer, ns, f"zephyr{i}", mode)
    assert await _found(call, writer, ns, "zephyr7", mode) == [ids[7]]
    summary = await _found(call, writer, ns, "storage cluster cutover", mode)
    assert summary[:1] == [done["summary_msg_id"]]


@pytest.mark.parametrize("mode", MODES)
async def test_a_saved_only_row_is_never_found_until_it_is_recorded(
    mode, call, ns, mint, recording, services
):
    token = mint(ns, "writer")  # the namespace does not record
    body = await save(
        call,
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c1",
        message_id="m1",
        content="the quarterly invoices were re-exported to the ledger",
    )
    assert body["saved"]
    assert await _found(call, token, ns, "quarterly invoices", mode) == []
    assert transcript_terms.postings_of(services.ch, ns, [(ns, "default", "c1", "m1")]) == []
    recording(ns, True)
    await ok(
        call,
        "conversation.append",
        token,
        namespace=ns,
        thread_id="c1",
        msg_id="m1",
        role="user",
        content="the quarterly invoices were re-exported to the ledger",
    )
    assert [r["origin"] for r in turn_rows(services.ch, ns)] == ["recorded"]
    assert await _found(call, token, ns, "quarterly invoices", mode) == ["m1"]


@pytest.mark.parametrize("mode", MODES)
async def test_scope_namespaces_agents_and_filters(mode, call, ns, writer, mint, recording):
    other, hidden = f"{ns}-b", f"{ns}-c"
    for n in (other, hidden):
        recording(n, True)
    await append_turn(call, writer, ns, "a", "t1", "user", "the walrus sings at dawn", run_id="r1")
    await append_turn(call, writer, ns, "b", "t2", "assistant", "a walrus sings for the walrus choir")
    other_writer = mint(other, "writer")
    await append_turn(call, other_writer, other, "a", "t3", "user", "walrus facts from the other namespace")
    await append_turn(
        call, mint(hidden, "writer"), hidden, "a", "t4", "user", "walrus in a namespace not granted"
    )
    token = mint([ns, other], "viewer")
    fan = await _search(call, token, query="walrus", search_mode=mode)
    assert fan["namespaces"] == [ns, other]
    assert {h["namespace"] for h in fan["hits"]} == {ns, other} and len(fan["hits"]) == 3
    one = await _search(call, token, namespace=ns, query="walrus", search_mode=mode)
    assert {h["namespace"] for h in one["hits"]} == {ns}
    assert [
        h["agent"]
        for h in (await _search(call, token, namespace=ns, query="walrus", agent="b", search_mode=mode))[
            "hits"
        ]
    ] == ["b"]
    assert (
        _ids(await _search(call, token, namespace=ns, query="walrus", thread_id="t1", search_mode=mode)) != []
    )
    by_run = await _search(call, token, namespace=ns, query="walrus", run_id="r1", search_mode=mode)
    assert [h["thread_id"] for h in by_run["hits"]] == ["t1"]
    by_role = await _search(call, token, namespace=ns, query="walrus", role="assistant", search_mode=mode)
    assert [h["thread_id"] for h in by_role["hits"]] == ["t2"]
    r = await call("conversation.search", token, namespace=hidden, query="walrus", search_mode=mode)
    assert r.status_code == 403


async def test_the_op_refuses_a_bad_mode_or_weight_naming_the_field(services, ns):
    who = Principal("test", (ns,), Role.viewer)
    for kw, field in (
        ({"search_mode": "semantic"}, "search_mode"),
        ({"search_mode": "hybrid", "lexical_weight": 1.01}, "lexical_weight"),
        ({"search_mode": "hybrid", "lexical_weight": -1.0}, "lexical_weight"),
        ({"search_mode": "hybrid", "lexical_weight": float("nan")}, "lexical_weight"),
    ):
        with pytest.raises(InvalidRequest) as err:
            await searching.search(services, who, "walrus", filters=Filters(), **kw)
        assert err.value.field == field


@contextlib.contextmanager
def _spied_worker(arq_worker: Any) -> Iterator[tuple[Any, Any, Any]]:
    """The test worker's Services, its settings as they were, and a spy on what its
    embedder reads; both put back afterwards."""
    from loom.providers.embedders import SpyEmbedder
    from workers import embed_jobs

    worker = arq_worker.ctx["loom"]
    before_settings, inner = worker.settings, embed_jobs.current_embedder()
    spy = SpyEmbedder(inner)
    embed_jobs.set_embedder(spy)
    try:
        yield worker, before_settings, spy
    finally:
        embed_jobs.set_embedder(inner)
        worker.settings = before_settings


async def test_the_speaker_prefix_changes_what_the_model_reads_never_what_is_stored(
    call, ns, writer, mint, services, arq_worker
):
    from tests.conversation.helpers import emb_row

    with _spied_worker(arq_worker) as (worker, before_settings, spy):
        worker.settings = before_settings.model_copy(update={"embed_speaker_prefix": True})
        await _append(
            call,
            writer,
            ns,
            [_turn("t", "u1", "my dog is called Pip"), _turn("t", "a1", "noted", role="assistant")],
        )
        worker.settings = before_settings
        await _append(call, writer, ns, [_turn("t", "u2", "and my cat is Tom")])
        # A re-embed reads the speaker from the embedding row (its job carries the text only).
        worker.settings = before_settings.model_copy(update={"embed_speaker_prefix": True})
        admin = mint(ns, "admin")
        await ok(call, "conversation.reembed", admin, namespace=ns, thread_id="t")
    assert spy.texts[:3] == ["User: my dog is called Pip", "Assistant: noted", "and my cat is Tom"]
    assert sorted(spy.texts[3:]) == [
        "Assistant: noted",
        "User: and my cat is Tom",
        "User: my dog is called Pip",
    ]
    assert emb_row(services.ch, ns, "t", "u1")["text"] == "my dog is called Pip"
    assert sorted(r["content"] for r in turn_rows(services.ch, ns)) == [
        "and my cat is Tom",
        "my dog is called Pip",
        "noted",
    ]


async def test_the_speaker_prefix_names_the_speaker_where_the_metadata_does(
    call, ns, writer, mint, services, arq_worker
):
    with _spied_worker(arq_worker) as (worker, before_settings, spy):
        worker.settings = before_settings.model_copy(update={"embed_speaker_prefix": True})
        await _append(
            call,
            writer,
            ns,
            [
                _turn("t", "c1", "I went to the support group", metadata={"speaker": "Caroline"}),
                _turn("t", "m1", "that is great", role="assistant", metadata={"speaker": "M" * 80}),
                _turn("t", "n1", "a number speaks", metadata={"speaker": 7}),
            ],
        )
        # A re-embed reads the name from the transcript row's metadata.
        await ok(call, "conversation.reembed", mint(ns, "admin"), namespace=ns, thread_id="t")
    expected = [
        "Caroline: I went to the support group",
        "M" * 64 + ": that is great",
        "User: a number speaks",
    ]
    assert spy.texts[:3] == expected
    assert sorted(spy.texts[3:]) == sorted(expected)


def test_model_text_prefers_the_speakers_name() -> None:
    from loom.ops.conversation.common import model_text

    assert model_text("hi", "user", False, True, "Caroline") == "Caroline: hi"
    assert model_text("hi", "user", False, True) == "User: hi"
    assert model_text("hi", "system", True, True, "Caroline") == "Summary: hi"
    assert model_text("hi", "user", False, False, "Caroline") == "hi"


def test_the_view_and_the_query_share_one_tokeniser_and_stemmer() -> None:
    from clickhouse_schema.runner import MIGRATIONS_DIR
    from loom.store import bm25

    sql = (MIGRATIONS_DIR / "016_transcript_terms.sql").read_text()
    assert sql.count(bm25.stemmed_terms_sql("content")) == 2  # the view and the backfill


def test_query_terms_drop_stop_words_and_stem(services) -> None:
    terms = transcript_terms.query_terms
    assert terms(services.ch, "What did I say about the dogs' running shoes?") == [
        "say",
        "dog",
        "run",
        "shoe",
    ]
    assert terms(services.ch, "who was it") == ["who", "was", "it"]  # nothing but stop-words: all kept
    # Compounds and numbers stay as they are; their letter parts are stemmed.
    assert terms(services.ch, "INC-48213 billing_ledger_v2") == [
        "inc",
        "48213",
        "bill",
        "ledger",
        "v2",
        "inc-48213",
        "billing_ledger_v2",
    ]


def test_terms_held_by_most_of_a_large_namespace_are_left_out_when_rarer_ones_exist() -> None:
    from loom.store.transcript_terms import _Corpus

    big = _Corpus(n=100_000, avgdl=40.0, df={"show": 18_000, "err_conn_reset": 3_000, "log": 23_000})
    assert set(big.weights()) == {"err_conn_reset"}
    # Every term common: all are kept (there is nothing rarer to rank by).
    assert set(_Corpus(n=100_000, df={"show": 18_000, "log": 23_000}).weights()) == {"show", "log"}
    # A small namespace is never pruned (under PRUNE_MIN_DF postings a term costs little).
    small = _Corpus(n=500, df={"dog": 400, "collie": 3}).weights()
    assert set(small) == {"dog", "collie"} and small["collie"] > small["dog"]


QUERIES = [
    "What did I say about booking a flight?",
    "INC-48213 in billing_ledger_v2 on db-01.prod, “Straße” — ok… • done",
    "Running studies: my dogs played; booked the meetings, classes boxes bus cats stopped shopping",
    "who was it",
    "Café crème brûlée at 7pm: user@example.com #tag /usr/local/bin series witches needed shared",
    "Σπίτι και σκύλος; 東京 tower; emoji 🐶 dogs",
    "a" * 70 + " short-lived MFA prompts, the 2nd reviewer's notes (v1.2.3)",
]


@pytest.mark.parametrize("stem", [True, False])
def test_the_python_query_terms_are_the_engines(services, stem) -> None:
    from loom.store import bm25

    for q in QUERIES:
        sql = [
            str(t)
            for t in services.ch.query(
                f"SELECT {bm25.query_terms_sql('{q:String}', stem=stem)}",
                parameters={"q": q, "stop": bm25.stop_words_param()},
            ).result_rows[0][0]
        ]
        assert bm25.py_query_terms(q, stem=stem) == sql, q


async def test_an_excerpt_longer_than_the_index_keeps_comes_from_the_transcript(
    call, ns, writer, other_services
):
    text = "opening words " + "x" * 2_500 + " zanzibar ends it"
    await _append(call, writer, ns, [_turn("t", "long", text)])
    who = Principal("test", (ns,), Role.viewer)
    short = await searching.search(other_services(), who, "zanzibar", search_mode="lexical")
    assert [h.excerpt for h in short.hits] == [text[:240]]
    wide = await searching.search(
        other_services(conversation_search_excerpt_chars=2_600), who, "zanzibar", search_mode="lexical"
    )
    assert [h.excerpt for h in wide.hits] == [text[:2_600]]
