"""The per-user indexes of saved messages (clickhouse_schema/003_saved.sql): fed by
ClickHouse from every insert, tokenised exactly as queries are."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clickhouse_schema.runner import MIGRATIONS_DIR, split_statements
from loom.clock import next_version
from loom.store import bm25
from loom.store import conversations as conv_store
from tests.conversation.helpers import revise_turn

MIGRATION = MIGRATIONS_DIR / "003_saved.sql"


def test_the_views_and_the_queries_share_one_tokeniser() -> None:
    sql = Path(MIGRATION).read_text()
    expected = bm25.terms_sql("content")
    # The saved_docs view, the saved_terms view: the same expression, character for character.
    assert sql.count(expected) == 2
    assert sql.count("extractAll(") == 2 * 2


def test_the_tokeniser(services: Any) -> None:
    [terms] = bm25.query_terms(
        services.ch, ["See INC-48213 in billing_ledger_v2 on db-01.prod, “Straße” — ok"]
    )
    assert terms == [
        "see",
        "inc",
        "48213",
        "in",
        "billing",
        "ledger",
        "v2",
        "on",
        "db",
        "01",
        "prod",
        "straße",
        "ok",
        "inc-48213",
        "billing_ledger_v2",
        "db-01.prod",
    ]
    [long] = bm25.query_terms(services.ch, ["a" * 65 + " b"])
    assert long == ["b"]  # terms over 64 characters are not indexed


def _rows(ch: Any, table: str, ns: str, columns: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in ch.query(
            f"SELECT {columns} FROM {table} FINAL WHERE namespace = {{ns:String}} ORDER BY ALL",
            parameters={"ns": ns},
        ).result_rows
    ]


def test_only_saved_rows_reach_the_index_and_revisions_retire_them(services: Any, ns: str) -> None:
    ch = services.ch
    now = datetime.now(UTC)
    conv_store.insert(
        ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "t",
                "plain",
                now,
                "user",
                "not saved, never indexed",
                user_id="u",
                version=next_version(),
            ),
            conv_store.Turn(
                ns,
                "default",
                "t",
                "kept",
                now,
                "user",
                "saved words here",
                user_id="u",
                is_saved=True,
                saved_at=now,
                version=next_version(),
            ),
        ],
    )
    assert _rows(ch, "saved_docs", ns, "msg_id, is_saved, doc_len") == [("kept", True, 3)]
    assert _rows(ch, "saved_terms", ns, "term, tf") == [("here", 1), ("saved", 1), ("words", 1)]
    assert [h.msg_id for h in bm25.search(ch, ns, "u", "words", limit=5)] == ["kept"]
    # A revision that clears the flag keeps saved_at, so it reaches the index.
    revise_turn(ch, ns, "default", "t", "kept", is_saved="false")
    assert _rows(ch, "saved_docs", ns, "msg_id, is_saved") == [("kept", False)]
    assert bm25.search(ch, ns, "u", "words", limit=5) == []
    # A tombstone likewise.
    revise_turn(ch, ns, "default", "t", "kept", is_saved="true")
    assert [h.msg_id for h in bm25.search(ch, ns, "u", "words", limit=5)] == ["kept"]
    revise_turn(ch, ns, "default", "t", "kept", tombstoned="true")
    assert bm25.search(ch, ns, "u", "words", limit=5) == []


def test_bm25_prefers_rare_terms_and_short_documents(services: Any, ns: str) -> None:
    ch = services.ch
    now = datetime.now(UTC)
    common = "the export job ran again " + "and other filler words " * 4
    texts = {f"c{i}": common for i in range(6)}
    texts["rare"] = common + "zebrafish"
    texts["short"] = "export job"
    conv_store.insert(
        ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "t",
                m,
                now,
                "user",
                text,
                user_id="u",
                is_saved=True,
                saved_at=now,
                version=next_version(),
            )
            for m, text in texts.items()
        ],
    )
    hits = bm25.search(ch, ns, "u", "zebrafish export", limit=10)
    assert hits[0].msg_id == "rare" and set(hits[0].matched) == {"zebrafish", "export"}
    assert hits[1].msg_id == "short"  # same term, shorter document
    assert all(h.score > 0 for h in hits) and len(hits) == 8
    assert [h.msg_id for h in bm25.search(ch, ns, "u", "zebrafish", limit=10, thread_id="other")] == []


def test_the_migration_backfills_rows_saved_before_it(services: Any, ns: str) -> None:
    """Re-running the migration's backfill (as a second runner would) adds nothing twice."""
    ch = services.ch
    now = datetime.now(UTC)
    conv_store.insert(
        ch,
        [
            conv_store.Turn(
                ns,
                "default",
                "t",
                "m",
                now,
                "user",
                "backfilled text",
                user_id="u",
                is_saved=True,
                saved_at=now,
                version=next_version(),
            )
        ],
    )
    backfill = [s for s in split_statements(Path(MIGRATION).read_text()) if s.startswith("INSERT INTO")]
    assert len(backfill) == 2
    for statement in backfill:
        ch.command(statement)
    assert [h.msg_id for h in bm25.search(ch, ns, "u", "backfilled", limit=5)] == ["m"]
    assert _rows(ch, "saved_docs", ns, "msg_id") == [("m",)]
    assert _rows(ch, "saved_vectors", ns, "msg_id") == []  # no embedding row was written
