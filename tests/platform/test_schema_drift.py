"""Every declared table row (loom.store.rows.TABLES) against the live schema after all
migrations: a column added in SQL but not declared in code, one declared but not in
SQL, or a type that differs, fails here. A table no code declares must be one the
engine fills itself (a materialized view's target) or the migrations' own record."""

from __future__ import annotations

import importlib
import pkgutil
import secrets
from typing import Any

import loom.store
from loom.store.clickhouse import connect
from loom.store.rows import TABLES, Table

# Tables no Python code writes rows into: the engine fills them (materialized views over
# conversations, conversation_embeddings, memories and memory_evidence) or the migration
# runner keeps them.
ENGINE_FILLED = {
    "conversation_terms",
    "conversation_vectors_384",
    "conversation_vectors_1536",
    "memory_terms",
    "evidence_terms",
    "saved_feed",
    "saved_docs",
    "saved_terms",
    "saved_vectors",
    "schema_migrations",
}


def _declared() -> dict[str, Table[Any]]:
    for mod in pkgutil.iter_modules(loom.store.__path__):
        importlib.import_module(f"loom.store.{mod.name}")
    return dict(TABLES)


def _live(ch: Any, table: str) -> dict[str, str]:
    result = ch.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String}",
        parameters={"t": table},
    )
    return {r["name"]: r["type"] for r in result.named_results()}


def drift(ch: Any, spec: Table[Any], table: str | None = None) -> list[str]:
    """What differs between the declaration and the live table (empty: nothing)."""
    live = _live(ch, table or spec.name)
    declared = {c.name: c.type for c in spec.columns}
    problems = [
        f"{spec.name}.{name} {typ}: in SQL, not declared in code"
        for name, typ in live.items()
        if name not in declared
    ]
    problems += [
        f"{spec.name}.{name} {typ}: declared in code, not in SQL"
        for name, typ in declared.items()
        if name not in live
    ]
    problems += [
        f"{spec.name}.{name}: declared {typ}, SQL has {live[name]}"
        for name, typ in declared.items()
        if name in live and live[name] != typ
    ]
    return problems


def test_every_declared_row_matches_the_live_schema(schema):
    ch = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    declared = _declared()
    assert declared, "no table declares its row"
    problems = [p for spec in declared.values() for p in drift(ch, spec)]
    assert problems == []


def test_every_table_is_declared_or_engine_filled(schema):
    ch = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    live = {
        r["name"]
        for r in ch.query(
            "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree%'"
        ).named_results()
    }
    undeclared = live - set(_declared()) - ENGINE_FILLED
    assert undeclared == set(), "a table written from code needs a declared row (loom.store.rows.table)"
    assert set(_declared()) <= live


def test_drift_is_caught(schema):
    """The comparison fails on a column added in SQL, one dropped, and a changed type."""
    ch = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    spec = _declared()["threads"]
    probe = f"drift_probe_{secrets.token_hex(4)}"
    ch.command(f"CREATE TABLE {probe} AS threads")
    try:
        assert drift(ch, spec, probe) == []
        ch.command(f"ALTER TABLE {probe} ADD COLUMN added String")
        ch.command(f"ALTER TABLE {probe} DROP COLUMN run_id")
        ch.command(f"ALTER TABLE {probe} MODIFY COLUMN title LowCardinality(String)")
        assert sorted(drift(ch, spec, probe)) == sorted(
            [
                "threads.added String: in SQL, not declared in code",
                "threads.run_id String: declared in code, not in SQL",
                "threads.title: declared String, SQL has LowCardinality(String)",
            ]
        )
    finally:
        ch.command(f"DROP TABLE IF EXISTS {probe}")
