"""Migration 020: loom.conversations and loom.conversation_embeddings rebuilt with small
granules on a database that already holds rows: every row (every version, tombstones)
kept, the definition kept (skip indexes, settings, TTL), the views still fed, no copy
left behind, and rows written to the old table while it was being copied carried over."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from clickhouse_schema import runner
from loom.settings import Settings
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import saved as saved_store
from loom.store.clickhouse import connect
from loom.store.schema import prepare

REBUILD = 20
TABLES = ("conversations", "conversation_embeddings")


def _fresh(settings: Settings, suffix: str) -> Settings:
    return settings.model_copy(update={"clickhouse_database": f"{settings.clickhouse_database}_{suffix}"})


def _before(monkeypatch: Any, s: Settings) -> Any:
    """A database migrated up to the migration before 020."""
    everything = runner.discover()
    monkeypatch.setattr(runner, "discover", lambda *a, **k: [m for m in everything if m.number < REBUILD])
    prepare(s, s.clickhouse_url)
    monkeypatch.setattr(runner, "discover", lambda *a, **k: everything)
    return connect(s.clickhouse_url, database=s.clickhouse_database)


def _turn(msg: str, version: int, **kw: Any) -> conv_store.Turn:
    base: dict[str, Any] = {
        "namespace": "ns",
        "agent": "a",
        "thread_id": "t",
        "msg_id": msg,
        "ts": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=version),
        "role": "user",
        "content": f"text of {msg} v{version}",
        "version": version,
    }
    return conv_store.Turn(**(base | kw))


def _embedding(msg: str, version: int, **kw: Any) -> emb_store.EmbeddingRow:
    vec = np.zeros(384, dtype=np.float32)
    vec[version % 384] = 1.0
    base: dict[str, Any] = {
        "namespace": "ns",
        "thread_id": "t",
        "msg_id": msg,
        "agent": "a",
        "role": "user",
        "run_id": "",
        "user_id": "",
        "ts": datetime(2026, 1, 1, tzinfo=UTC),
        "text": f"text of {msg}",
        "embedding": vec,
        "model": "fake",
        "version": version,
    }
    return emb_store.EmbeddingRow(**(base | kw))


def _fill(ch: Any) -> None:
    """Rows in several parts, revisions in their own (one insert keeps a key's newest
    version only); merges are stopped, so every version stays stored."""
    ch.command("SYSTEM STOP MERGES")
    conv_store.insert(ch, [_turn(f"m{i:03d}", 10 + i) for i in range(300)])
    conv_store.insert(
        ch,
        [
            _turn("m000", 1000, content="revised"),  # a second version of a row
            _turn("m001", 1001, tombstoned=True, tombstone_reason="deleted"),
            _turn("m002", 1002, user_id="u1", is_saved=True, saved_at=datetime(2026, 1, 2, tzinfo=UTC)),
        ],
    )
    conv_store.insert(ch, [_turn("m003", 2000, agent="b")])  # another agent's copy
    emb_store.insert(ch, [_embedding(f"m{i:03d}", 10 + i) for i in range(300)])
    emb_store.insert(ch, [_embedding("m001", 1001, tombstoned=True, embedding=[])])


def _every_row(ch: Any, table: str) -> list[tuple[Any, ...]]:
    """Every stored version, every column (no FINAL)."""
    return [tuple(r) for r in ch.query(f"SELECT * FROM {table} ORDER BY ALL").result_rows]


def _without_granularity(create_query: str) -> str:
    return re.sub(r"index_granularity = \d+(, )?", "", create_query)


def _create_query(ch: Any, table: str) -> str:
    return str(
        ch.query(
            "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
            parameters={"t": table},
        ).result_rows[0][0]
    )


def test_rebuild_keeps_every_row_and_the_definition(schema, monkeypatch):
    s = _fresh(schema, "gran").model_copy(update={"retention_conversations_days": 3650})
    ch = _before(monkeypatch, s)
    try:
        _rebuild_keeps_every_row(s, ch)
    finally:
        ch.command("SYSTEM START MERGES")


def _rebuild_keeps_every_row(s: Settings, ch: Any) -> None:
    _fill(ch)
    rows = {t: _every_row(ch, t) for t in TABLES}
    assert len(rows["conversations"]) == 304 and len(rows["conversation_embeddings"]) == 301
    defined = {t: _create_query(ch, t) for t in TABLES}
    assert "index_granularity = 8192" in defined["conversations"]

    applied = prepare(s, s.clickhouse_url).applied
    # 020 and whatever later migrations exist, in order, from where _before stopped
    numbers = [a.split("_")[0] for a in applied]
    assert numbers[0] == "020" and numbers == sorted(numbers)

    for table in TABLES:
        assert _every_row(ch, table) == rows[table], table
        now = _create_query(ch, table)
        assert "index_granularity = 256" in now
        # the rest of the definition as it was: skip indexes, settings, TTL
        assert _without_granularity(now) == _without_granularity(defined[table])
    assert "TTL toDateTime(ts) + toIntervalDay(3650)" in _create_query(ch, "conversations")
    left = ch.query(
        "SELECT name FROM system.tables WHERE database = currentDatabase() AND name LIKE '%\\_020\\_%'"
    )
    assert left.result_rows == []

    # the reads by key answer the newest version
    row = saved_store.transcript_row(ch, ("ns", "a", "t", "m000"))
    assert row is not None and row.content == "revised"
    assert saved_store.transcript_row(ch, ("ns", "a", "t", "m002")).is_saved  # type: ignore[union-attr]
    emb = emb_store.get(ch, "ns", "t", "m005")
    assert emb is not None and emb.version == 15 and len(emb.embedding) == 384
    assert emb_store.states(ch, [("ns", "t", "m001")])[("ns", "t", "m001")].tombstoned

    # the views still read the tables under their names
    conv_store.insert(ch, [_turn("m900", 3000, user_id="u1", is_saved=True, saved_at=datetime.now(UTC))])
    emb_store.insert(ch, [_embedding("m900", 3000)])
    saved = ch.query("SELECT count() FROM saved_docs WHERE msg_id = 'm900'").result_rows[0][0]
    vectors = ch.query("SELECT count() FROM conversation_vectors_384 WHERE msg_id = 'm900'").result_rows[0][0]
    assert (saved, vectors) == (1, 1)


def test_rows_written_to_the_old_table_during_the_copy_are_carried_over(schema, monkeypatch):
    s = _fresh(schema, "granrace")
    ch = _before(monkeypatch, s)
    try:
        _late_rows_carried_over(ch)
    finally:
        ch.command("SYSTEM START MERGES")


def _late_rows_carried_over(ch: Any) -> None:
    _fill(ch)
    migration = next(m for m in runner.discover() if m.number == REBUILD)
    statements = migration.statements()
    copy_of = {
        t: next(i for i, st in enumerate(statements) if st.startswith(f"INSERT INTO {t}_020_"))
        for t in TABLES
    }
    late_turn = _turn("late", 5000)
    late_emb = _embedding("late", 5000)
    for i, statement in enumerate(statements):
        ch.command(statement)
        if i == copy_of["conversations"]:  # copied, not yet swapped: a writer appends
            conv_store.insert(ch, [late_turn])
        if i == copy_of["conversation_embeddings"]:
            emb_store.insert(ch, [late_emb])
    assert saved_store.transcript_row(ch, late_turn.key) is not None
    assert emb_store.get(ch, "ns", "t", "late") is not None
    assert ch.query("SELECT count() FROM conversations").result_rows[0][0] == 305
    assert "index_granularity = 256" in _create_query(ch, "conversations")
