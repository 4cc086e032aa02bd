"""conversation.list_saved_messages, conversation.saved_status and
conversation.search_saved_messages: paging, status, relevance of both legs, fusion,
fallbacks, and that a message reading as high is never a hit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from loom.clock import next_version
from loom.ops.conversation.saved.saved_reads import centred_excerpt
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from tests.conversation import helpers
from tests.conversation.helpers import ok, revise_turn, tombstone_turn

LIST = "conversation.list_saved_messages"
STATUS = "conversation.saved_status"
SEARCH = "conversation.search_saved_messages"
HIGH = "sure, the prod login is password=Tr0ub4dor&3xq"

FILLER = (
    "We went through the deployment checklist, the helm chart values and the readiness probe timings. "
    "Nothing unusual showed up in the staging cluster logs, and the canary stayed green all afternoon. "
)


@pytest.fixture
def token(ns: str, mint: Any) -> str:
    return str(mint(ns, "writer"))


async def save(
    call: Any,
    token: str,
    ns: str,
    msg: str,
    content: str,
    *,
    user: str = "alice",
    conv: str = "c",
    role: str = "assistant",
) -> dict[str, Any]:
    body = await helpers.save(
        call,
        token,
        namespace=ns,
        user_id=user,
        conversation_id=conv,
        message_id=msg,
        role=role,
        content=content,
    )
    assert body["saved"] is True, body
    return body


def ids(hits: Sequence[dict[str, Any]]) -> list[str]:
    return [h["message_id"] for h in hits]


class TableEmbedder:
    """Vectors named per text (by a keyword it contains), for fusion tests whose
    similarities must be exact; any other text gets a vector orthogonal to them all."""

    model_id = "table-embedder"

    def __init__(self, table: dict[str, np.ndarray], dim: int = 8) -> None:
        self.table = table
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            vec = next((v for k, v in self.table.items() if k in t), None)
            if vec is None:
                vec = np.zeros(self.dim, dtype=np.float32)
                vec[-1] = 1.0
            out.append(np.asarray(vec, dtype=np.float32) / np.linalg.norm(vec))
        return np.stack(out)


def unit(*xs: float, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[: len(xs)] = xs
    return v


# -- list ------------------------------------------------------------------------------------


async def test_list_pages_most_recently_saved_first(call, ns, token):
    for i in range(7):
        await save(call, token, ns, f"m{i}", f"saved message number {i}", conv="c1" if i % 2 else "c2")
        await asyncio.sleep(0.002)  # distinct saved_at (milliseconds)
    seen: list[str] = []
    cursor = None
    pages = []
    while True:
        body = await ok(
            call,
            LIST,
            token,
            namespace=ns,
            user_id="alice",
            limit=3,
            **({"cursor": cursor} if cursor else {}),
        )
        pages.append(len(body["messages"]))
        seen += ids(body["messages"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == [3, 3, 1]
    assert seen == [f"m{i}" for i in range(6, -1, -1)]
    body = await ok(call, LIST, token, namespace=ns, user_id="alice", limit=200, conversation_id="c1")
    assert ids(body["messages"]) == ["m5", "m3", "m1"]
    first = body["messages"][0]
    assert first["conversation_id"] == "c1" and first["role"] == "assistant"
    assert first["excerpt"] == "saved message number 5"
    # Other users see none of them.
    assert (await ok(call, LIST, token, namespace=ns, user_id="bob"))["messages"] == []


async def test_list_cursor_is_opaque_and_bound_to_its_listing(call, ns, token):
    for i in range(3):
        await save(call, token, ns, f"m{i}", f"text {i}")
    body = await ok(call, LIST, token, namespace=ns, user_id="alice", limit=1)
    r = await call(
        LIST,
        token,
        namespace=ns,
        user_id="alice",
        limit=1,
        cursor=body["next_cursor"],
        conversation_id="other",
    )
    assert r.status_code == 422 and r.json()["field"] == "cursor" and r.json()["rule"] == "same_listing"
    r = await call(LIST, token, namespace=ns, user_id="bob", limit=1, cursor=body["next_cursor"])
    assert r.status_code == 422 and r.json()["rule"] == "same_listing"
    r = await call(LIST, token, namespace=ns, user_id="alice", cursor="not-a-cursor!")
    assert r.status_code == 422 and r.json()["rule"] == "opaque"
    for limit in (0, 201):
        r = await call(LIST, token, namespace=ns, user_id="alice", limit=limit)
        assert r.status_code == 422 and r.json()["field"] == "limit"


async def test_list_ts_is_the_save_time_else_the_message_time(call, ns, token, services):
    await helpers.save(
        call, token, namespace=ns, content="an old message saved today", ts="2024-01-02T03:04:05Z"
    )
    # A row an earlier build saved without a save time.
    old = datetime(2023, 5, 6, 7, 8, 9, tzinfo=UTC)
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "c",
                "legacy",
                old,
                "user",
                "saved long ago",
                user_id="alice",
                is_saved=True,
                version=next_version(),
            )
        ],
    )
    body = await ok(call, LIST, token, namespace=ns, user_id="alice")
    by_id = {m["message_id"]: m for m in body["messages"]}
    saved_ts = datetime.fromisoformat(by_id["m"]["ts"].replace("Z", "+00:00"))
    assert abs(saved_ts - datetime.now(UTC)) < timedelta(minutes=5)
    assert by_id["legacy"]["ts"].startswith("2023-05-06T07:08:09")
    assert ids(body["messages"]) == ["m", "legacy"]


async def test_list_shows_a_high_message_with_an_empty_excerpt(call, ns, token, services):
    await save(call, token, ns, "plain", "a plain saved note")
    # Saved by an earlier build, the secret within the 240 + 1,024 characters checked.
    late = "x" * 1000 + " " + HIGH
    now = datetime.now(UTC)
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "c",
                "high",
                now,
                "user",
                HIGH,
                user_id="alice",
                is_saved=True,
                saved_at=now,
                version=next_version(),
            ),
            conv_store.Turn(
                ns,
                "default",
                "c",
                "late",
                now,
                "user",
                late,
                user_id="alice",
                is_saved=True,
                saved_at=now,
                version=next_version(),
            ),
        ],
    )
    body = await ok(call, LIST, token, namespace=ns, user_id="alice")
    excerpts = {m["message_id"]: m["excerpt"] for m in body["messages"]}
    assert excerpts == {"plain": "a plain saved note", "high": "", "late": ""}


async def test_list_drops_what_the_transcript_no_longer_holds(call, ns, token, services):
    await save(call, token, ns, "kept", "kept")
    await save(call, token, ns, "gone", "removed behind the index's back")
    # An erasure or a TTL removes the row without passing through the index's views.
    services.ch.command(
        "DELETE FROM conversations WHERE namespace = {ns:String} AND msg_id = 'gone'", parameters={"ns": ns}
    )
    assert ids((await ok(call, LIST, token, namespace=ns, user_id="alice"))["messages"]) == ["kept"]


# -- status ------------------------------------------------------------------------------------


async def test_saved_status(call, ns, token):
    await save(call, token, ns, "a", "first")
    await save(call, token, ns, "b", "second")
    await save(call, token, ns, "c", "bob's", user="bob")
    await save(call, token, ns, "d", "other conversation", conv="elsewhere")
    await ok(
        call,
        "conversation.unsave_message",
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_id="b",
    )
    body = await ok(
        call,
        STATUS,
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_ids=["a", "b", "c", "d", "nope"],
    )
    assert body == {"saved": {"a": True, "b": False, "c": False, "d": False, "nope": False}}
    r = await call(STATUS, token, namespace=ns, user_id="alice", conversation_id="c", message_ids=[])
    assert r.status_code == 422 and r.json()["field"] == "message_ids"
    r = await call(
        STATUS,
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_ids=[f"m{i}" for i in range(501)],
    )
    assert r.status_code == 422 and r.json()["field"] == "message_ids"
    body = await ok(
        call,
        STATUS,
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_ids=[f"m{i}" for i in range(500)],
    )
    assert len(body["saved"]) == 500 and not any(body["saved"].values())


# -- search: the lexical leg ---------------------------------------------------------------------


async def test_an_exact_rare_term_deep_in_a_long_message_ranks(call, ns, token):
    deep = (
        FILLER * 14
        + "The outage was tracked as INC-48213 and fixed by rebuilding billing_ledger_v2. "
        + FILLER
    )
    assert len(deep) > 3000 and deep.index("INC-48213") > 2048  # beyond what the vector is built from
    await save(call, token, ns, "deep", deep)
    for i in range(8):
        await save(call, token, ns, f"other{i}", FILLER + f" Ticket INC-5821{i} was about the ledger export.")
    for mode in ("lexical", "hybrid"):
        for query in ("INC-48213", "billing_ledger_v2"):
            body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query=query, search_mode=mode)
            assert body["search_mode"] == mode and body["fallback_reason"] is None
            assert ids(body["hits"])[0] == "deep", (mode, query, body["hits"][:3])
            top = body["hits"][0]
            assert "lexical" in top["legs"]
            # The excerpt is centred on the match, not the message's start.
            assert query in top["excerpt"] and len(top["excerpt"]) <= 240
            assert not deep.startswith(top["excerpt"][:40])


async def test_a_phrase_deep_in_a_long_message_outranks_short_partial_matches(call, ns, token):
    """BM25's length normalisation alone ranks short messages holding three of the
    phrase's four words above the long answer holding the whole phrase: hits holding
    more of the query's terms come first."""
    deep = FILLER * 14 + "In the end we had to rotate staging ledger keys by hand. " + FILLER
    assert deep.index("rotate staging ledger keys") > 2048
    await save(call, token, ns, "deep", deep)
    for i, words in enumerate(
        ("rotate staging keys", "staging ledger keys", "rotate ledger keys", "rotate staging ledger")
    ):
        await save(call, token, ns, f"short{i}", f"Reminder: {words}.")
    body = await ok(
        call,
        SEARCH,
        token,
        namespace=ns,
        user_id="alice",
        query="rotate staging ledger keys",
        search_mode="lexical",
    )
    assert ids(body["hits"])[0] == "deep", body["hits"][:3]
    assert "rotate staging ledger keys" in body["hits"][0]["excerpt"]
    # Hybrid fuses it with the vector leg (which never saw past 2,048 characters): it ranks.
    body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query="rotate staging ledger keys")
    assert "deep" in ids(body["hits"])


async def test_lexical_reads_the_whole_text_and_statistics_are_per_user(call, ns, token):
    await save(call, token, ns, "a", "zanzibar " + FILLER)
    await save(call, token, ns, "b", FILLER + " zanzibar zanzibar zanzibar")
    await save(call, token, ns, "c", "nothing relevant here")
    await save(call, token, ns, "bobs", "zanzibar zanzibar zanzibar zanzibar", user="bob")
    body = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="Zanzibar", search_mode="lexical"
    )
    assert ids(body["hits"]) == ["b", "a"]  # more occurrences first; never bob's
    assert all(h["legs"] == ["lexical"] for h in body["hits"])
    assert body["hits"][0]["score"] > body["hits"][1]["score"] > 0
    bob = await ok(call, SEARCH, token, namespace=ns, user_id="bob", query="zanzibar", search_mode="lexical")
    assert ids(bob["hits"]) == ["bobs"]


async def test_only_live_saved_messages_of_this_user_in_this_namespace(call, ns, token, mint, services):
    other_ns = ns + "x"
    other_token = mint(other_ns, "writer")
    await save(call, token, ns, "live", "quokka sighting notes")
    await save(call, token, ns, "unsaved", "quokka census")
    await save(call, token, ns, "tomb", "quokka habitat")
    await save(call, token, ns, "bob", "quokka for bob", user="bob")
    await save(call, other_token, other_ns, "far", "quokka elsewhere")
    await ok(
        call,
        "conversation.unsave_message",
        token,
        namespace=ns,
        user_id="alice",
        conversation_id="c",
        message_id="unsaved",
    )
    tombstone_turn(services.ch, ns, "default", "c", "tomb")
    for mode in ("lexical", "hybrid", "semantic"):
        body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query="quokka", search_mode=mode)
        assert set(ids(body["hits"])) <= {"live"}, (mode, body)
    body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query="quokka", search_mode="lexical")
    assert ids(body["hits"]) == ["live"]


async def test_conversation_filter(call, ns, token):
    await save(call, token, ns, "a", "platypus one", conv="c1")
    await save(call, token, ns, "b", "platypus two", conv="c2")
    for mode in ("lexical", "hybrid"):
        body = await ok(
            call,
            SEARCH,
            token,
            namespace=ns,
            user_id="alice",
            query="platypus",
            search_mode=mode,
            conversation_id="c2",
        )
        assert ids(body["hits"]) == ["b"]


# -- search: the vector leg, fusion, fallbacks -----------------------------------------------------


@pytest.fixture(scope="session")
def minilm() -> Any:
    from loom.providers.embedders import MiniLMEmbedder

    return MiniLMEmbedder(intra_op_num_threads=1)


async def test_a_paraphrase_finds_its_message(call, ns, token, api_embedder, minilm):
    api_embedder(minilm)
    texts = {
        "flight": "My flight to Lisbon was cancelled, so I rebooked it for Tuesday morning.",
        "bread": "The sourdough starter needs feeding twice a day with equal flour and water.",
        "ledger": "We moved the invoices to the new ledger and fixed the refund queue.",
        "gpu": "The training run ran out of GPU memory at batch size 64.",
        "tax": "The quarterly tax filing is due at the end of the month.",
    }
    for msg, text in texts.items():
        await save(call, token, ns, msg, text)
    queries = {
        "flight": "which day is my rebooked trip to Portugal",
        "bread": "how often do I feed the bread culture",
    }
    for want, query in queries.items():
        for mode in ("semantic", "hybrid"):
            body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query=query, search_mode=mode)
            assert ids(body["hits"])[0] == want, (mode, query, body["hits"])
            assert "vector" in body["hits"][0]["legs"]
        semantic = await ok(
            call, SEARCH, token, namespace=ns, user_id="alice", query=query, search_mode="semantic"
        )
        assert all(h["legs"] == ["vector"] for h in semantic["hits"])
        assert 0.3 <= semantic["hits"][0]["score"] <= 1.0  # cosine, at or above the floor


async def test_lexical_weight_scales_the_lexical_leg(call, ns, token, api_embedder):
    q = unit(1, 0)
    api_embedder(
        TableEmbedder(
            {  # the first key a text holds names its vector
                "LEXICAL": unit(0.6, 0.8),  # cosine 0.6 with the query: second in the vector leg
                "SEMANTIC": unit(1, 0.05),  # cosine ~1: first in the vector leg
                "ledger reconciliation": q,  # the query
            }
        )
    )
    await save(call, token, ns, "lex", "LEXICAL: the ledger reconciliation job, ledger reconciliation again")
    await save(call, token, ns, "sem", "SEMANTIC: matching the books at month end")
    full = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query="ledger reconciliation")
    assert ids(full["hits"]) == ["lex", "sem"]
    assert full["hits"][0]["legs"] == ["vector", "lexical"] and full["hits"][1]["legs"] == ["vector"]
    # The default, 0.5: an equal vote.
    assert full["hits"][0]["score"] == pytest.approx(0.5 / 62 + 0.5 / 61, abs=1e-6)
    none = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="ledger reconciliation", lexical_weight=0.0
    )
    assert ids(none["hits"]) == ["sem", "lex"]
    assert none["hits"][1]["score"] == pytest.approx(1 / 62, abs=1e-6)
    heavy = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="ledger reconciliation", lexical_weight=0.9
    )
    assert heavy["hits"][0]["score"] == pytest.approx(0.1 / 62 + 0.9 / 61, abs=1e-6)
    only = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="ledger reconciliation", lexical_weight=1.0
    )
    assert ids(only["hits"]) == ["lex"] and only["hits"][0]["score"] == pytest.approx(1 / 61, abs=1e-6)
    for bad in (-0.1, 1.5, 100):
        r = await call(SEARCH, token, namespace=ns, user_id="alice", query="x", lexical_weight=bad)
        assert r.status_code == 422 and r.json()["field"] == "lexical_weight"


async def test_embedder_failure_falls_back_to_lexical(call, ns, token, api_embedder):
    await save(call, token, ns, "m", "the wombat report is due")
    api_embedder(FakeEmbedder(fail=True))
    for mode in ("hybrid", "semantic"):
        body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query="wombat", search_mode=mode)
        assert body["search_mode"] == "lexical"
        assert body["fallback_reason"].startswith("embedder_unavailable")
        assert ids(body["hits"]) == ["m"] and body["hits"][0]["legs"] == ["lexical"]


async def test_a_query_that_reads_as_high_is_never_embedded(call, ns, token, api_embedder):
    await save(call, token, ns, "m", "the password rotation runbook")
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    body = await ok(call, SEARCH, token, namespace=ns, user_id="alice", query=f"password rotation {HIGH}")
    assert spy.texts == []
    assert body["search_mode"] == "lexical" and body["fallback_reason"] == "query_high_sensitivity"
    assert ids(body["hits"]) == ["m"]


async def test_a_saved_message_that_reads_as_high_is_never_a_hit(call, ns, token, services, api_embedder):
    fake = api_embedder(FakeEmbedder())
    await save(call, token, ns, "plain", "the pangolin runbook is plain")
    # An earlier build saved these: one flagged high, one not flagged at all; both with
    # live vectors of their text and postings in the index.
    now = datetime.now(UTC)
    texts = {"flagged": f"pangolin {HIGH}", "unflagged": f"pangolin note, {HIGH}"}
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "c",
                m,
                now,
                "user",
                text,
                user_id="alice",
                is_saved=True,
                saved_at=now,
                high_sensitivity=(m == "flagged"),
                version=next_version(),
            )
            for m, text in texts.items()
        ],
    )
    emb_store.insert(
        services.ch,
        [
            emb_store.EmbeddingRow(
                ns,
                "c",
                m,
                "default",
                "user",
                "",
                "alice",
                now,
                text[:2048],
                fake.vector(text[:2048]),
                fake.model_id,
                is_saved=True,
                saved_at=now,
                version=next_version(),
            )
            for m, text in texts.items()
        ],
    )
    plain_query = "pangolin note sure the prod login is"  # shares the high texts' words
    for mode in ("lexical", "semantic", "hybrid"):
        body = await ok(
            call, SEARCH, token, namespace=ns, user_id="alice", query=plain_query, search_mode=mode, limit=100
        )
        assert not set(ids(body["hits"])) & set(texts), (mode, body)
    body = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="pangolin", search_mode="lexical"
    )
    assert ids(body["hits"]) == ["plain"]
    # Flag it high in the transcript afterwards: gone from the lexical leg's index too.
    revise_turn(services.ch, ns, "default", "c", "plain", high_sensitivity="true")
    body = await ok(
        call, SEARCH, token, namespace=ns, user_id="alice", query="pangolin", search_mode="lexical"
    )
    assert ids(body["hits"]) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 101}, "limit"),
        ({"query": "x", "search_mode": "fuzzy"}, "search_mode"),
        ({"query": "x", "user_id": ""}, "user_id"),
        ({"query": "x", "conversation_id": ""}, "conversation_id"),
        ({"query": "x", "surprise": True}, "surprise"),
    ],
)
async def test_search_bad_input(call, ns, token, body, field):
    r = await call(SEARCH, token, **{"namespace": ns, "user_id": "alice", **body})
    assert 400 <= r.status_code < 500 and r.json()["field"] == field, r.text


async def test_search_without_user_id_needs_a_pinned_token(call, ns, token):
    r = await call(SEARCH, token, namespace=ns, query="x")
    assert r.status_code == 422 and r.json()["field"] == "user_id" and r.json()["rule"] == "required"


# -- excerpts ----------------------------------------------------------------------------------


def test_centred_excerpt() -> None:
    text = "a" * 500 + " the INC-48213 ticket " + "b" * 500
    out = centred_excerpt(text, ["inc-48213"], 100)
    assert "INC-48213" in out and len(out) <= 100
    start = text.index(out)
    assert abs((start + 50) - text.index("INC-48213")) < 30  # centred on it
    # The densest cluster of distinct terms wins over a lone earlier match.
    text = "ledger " + "x " * 300 + "ledger reconciliation finished " + "y " * 300
    out = centred_excerpt(text, ["ledger", "reconciliation"], 80)
    assert "ledger reconciliation" in out
    # Whole tokens only, any case; short texts come back whole; no match: the start.
    assert centred_excerpt("short Ledger text", ["ledger"], 240) == "short Ledger text"
    assert centred_excerpt("x" * 300 + " ledgers", ["ledger"], 50) == "x" * 50


async def test_a_save_embeds_behind_the_speakers_name_with_the_prefix_on(
    call, ns, token, api_embedder, services
):
    spy = api_embedder(SpyEmbedder(FakeEmbedder()))
    before = services.settings
    services.settings = before.model_copy(update={"embed_speaker_prefix": True})
    try:
        for msg, speaker in (("named", "Caroline"), ("numbered", 7)):
            body = await helpers.save(
                call, token, namespace=ns, user_id="alice", conversation_id="c", message_id=msg,
                role="user", content=f"the {msg} one went to the support group", metadata={"speaker": speaker},
            )  # fmt: skip
            assert body["saved"] is True, body
    finally:
        services.settings = before
    assert spy.texts == [
        "Caroline: the named one went to the support group",
        "User: the numbered one went to the support group",
    ]
