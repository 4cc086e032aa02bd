"""Time phrases in conversation.search's query: the window they set (loom.query_time),
the hits it keeps in every mode, the anchor of "before the move", and the answer
without the window when it holds nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loom.clock import next_version
from loom.providers.embedders import FakeEmbedder
from loom.query_time import asks_when, window
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from tests.conversation.helpers import ok, raise_marks

FRIDAY = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "since", "until"),
    [
        (
            "what did we decide last week",
            datetime(2026, 11, 23, tzinfo=UTC),
            datetime(2026, 11, 30, tzinfo=UTC),
        ),
        ("notes from yesterday", datetime(2026, 12, 3, tzinfo=UTC), datetime(2026, 12, 4, tzinfo=UTC)),
        ("the invoices in May", datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)),
        ("the invoices in May 2024", datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)),
        ("what we shipped in 2023", datetime(2023, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC)),
        ("budget before 3 March 2024", None, datetime(2024, 3, 3, tzinfo=UTC)),
        ("what happened after May 2023", datetime(2023, 6, 1, tzinfo=UTC), None),
        ("changes since 2024-01-15", datetime(2024, 1, 15, tzinfo=UTC), None),
        ("errors in the last 3 days", FRIDAY - timedelta(days=3), None),
        ("last month's invoices", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_time_phrases_set_their_window(query, since, until):
    got = window(query, FRIDAY)
    assert got is not None and (got.since, got.until) == (since, until) and got.phrase in query


def test_questions_without_a_bound_set_no_window():
    assert window("When did Caroline go to the support group?", FRIDAY) is None
    assert asks_when("When did Caroline go to the support group?")
    assert window("what may we do about the ledger", FRIDAY) is None  # "may", the verb
    anchored = window("what changed before the move", FRIDAY)
    assert anchored is not None and (anchored.anchor, anchored.anchor_side) == ("the move", "before")


def _seed(services, ns: str, turns: list[tuple[str, datetime, str]]) -> None:
    """Turns at chosen times, through the storage layer (append stamps the present)."""
    fake = FakeEmbedder()
    rows, embs = [], []
    for msg_id, ts, content in turns:
        v = next_version()
        rows.append(
            conv_store.Turn(
                namespace=ns,
                agent="default",
                thread_id="t",
                msg_id=msg_id,
                ts=ts,
                role="user",
                content=content,
                user_id="",
                version=v,
            )
        )
        embs.append(
            emb_store.EmbeddingRow(
                ns,
                "t",
                msg_id,
                "default",
                "user",
                "",
                "",
                ts,
                content,
                fake.vector(content),
                fake.model_id,
                version=v,
            )
        )
    conv_store.insert(services.ch, rows)
    emb_store.insert(services.ch, embs)
    raise_marks(services.ch, ns)


async def test_a_time_phrase_keeps_the_hits_in_its_window(call, ns, mint, services):
    now = datetime.now(UTC)
    _seed(
        services,
        ns,
        [
            ("old", datetime(2023, 5, 10, tzinfo=UTC), "we moved the invoices to the ledger"),
            ("move", datetime(2024, 2, 1, tzinfo=UTC), "the office move happened today, boxes everywhere"),
            ("mid", datetime(2024, 6, 1, tzinfo=UTC), "the ledger invoices are reconciled"),
            ("new", now - timedelta(minutes=5), "invoices ledger review done"),
        ],
    )
    viewer = mint(ns, "viewer")

    async def found(query: str, mode: str, **kw) -> dict:
        return await ok(
            call, "conversation.search", viewer, namespace=ns, query=query, search_mode=mode, **kw
        )

    for mode in ("vector", "hybrid", "lexical"):
        got = await found("ledger invoices in May 2023", mode)
        assert [h["msg_id"] for h in got["hits"]] == ["old"], mode
        assert got["time_window"]["phrase"] == "in May 2023" and got["time_window"]["applied"] is True
        got = await found("ledger invoices before the move", mode)  # until the turn "the move" finds
        assert [h["msg_id"] for h in got["hits"]] == ["old"], mode
        assert got["time_window"]["until"].startswith("2024-02-01")
        got = await found("ledger invoices after the move", mode)
        assert {h["msg_id"] for h in got["hits"]} == {"mid", "new"}, mode
        got = await found("ledger invoices today", mode)
        assert [h["msg_id"] for h in got["hits"]] == ["new"], mode
        # A window holding nothing: answered without it, and said so.
        got = await found("ledger invoices in 2019", mode)
        assert {h["msg_id"] for h in got["hits"]} >= {"old", "mid", "new"}, mode
        assert got["time_window"]["applied"] is False
        got = await found("ledger invoices in May 2023", mode, time_phrases="ignore")
        assert {h["msg_id"] for h in got["hits"]} >= {"old", "mid", "new"} and got["time_window"] is None


async def test_time_phrases_takes_filter_or_ignore(call, ns, mint):
    r = await call(
        "conversation.search", mint(ns, "viewer"), namespace=ns, query="x", time_phrases="sometimes"
    )
    assert r.status_code == 422 and "time_phrases" in r.text
