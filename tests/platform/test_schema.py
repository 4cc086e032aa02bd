"""Migrations, retention TTL, tiering and the cluster DDL."""

from __future__ import annotations

import re
import threading

from clickhouse_schema import runner
from loom.settings import Settings
from loom.store.clickhouse import DEFER_SETTING, INDEX_ON_INSERT_MIN_ROWS, connect, insert_settings
from loom.store.schema import prepare


def _fresh(settings: Settings, suffix: str) -> Settings:
    return settings.model_copy(update={"clickhouse_database": f"{settings.clickhouse_database}_{suffix}"})


def _create_query(ch, table: str) -> str:
    return str(
        ch.query(
            "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
            "AND name = {t:String}",
            parameters={"t": table},
        ).result_rows[0][0]
    )


def test_migrations_apply_once_and_are_idempotent(schema):
    s = _fresh(schema, "mig")
    first = prepare(s, s.clickhouse_url)
    assert first.applied and first.applied[0].startswith("001_")
    again = prepare(s, s.clickhouse_url)
    assert again.applied == []
    ch = connect(s.clickhouse_url, database=s.clickhouse_database)
    tables = {r[0] for r in ch.query("SHOW TABLES").result_rows}
    assert {
        "namespaces",
        "conversations",
        "conversation_embeddings",
        "threads",
        "session_briefs",
        "session_brief_revisions",
        "tokens",
        "schema_migrations",
    } <= tables
    counts = ch.query("SELECT number, count() FROM schema_migrations FINAL GROUP BY number").result_rows
    assert all(c == 1 for _, c in counts)


def test_tables_written_per_append_flush_merge_with_less_rewriting(schema):
    """Migration 005: the merge selector's base is raised where every flush adds a part."""
    ch = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    for table in (
        "conversations",
        "conversation_embeddings",
        "threads",
        "conversation_vectors_384",
        "conversation_vectors_1536",
    ):
        assert "merge_selector_base = 10" in _create_query(ch, table), table


def test_two_processes_migrate_at_once(schema):
    s = _fresh(schema, "race")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            prepare(s, s.clickhouse_url)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ch = connect(s.clickhouse_url, database=s.clickhouse_database)
    assert ch.query("SELECT count() FROM schema_migrations FINAL").result_rows[0][0] == len(runner.discover())


def test_retention_ttl_on_conversations_only(schema):
    s = _fresh(schema, "ttl")
    prepare(s.model_copy(update={"retention_conversations_days": 30}), s.clickhouse_url)
    ch = connect(s.clickhouse_url, database=s.clickhouse_database)
    assert "TTL toDateTime(ts) + toIntervalDay(30)" in _create_query(ch, "conversations")
    assert " TTL " not in _create_query(ch, "conversation_embeddings")
    prepare(s, s.clickhouse_url)  # 0 = keep forever: the TTL goes
    assert " TTL " not in _create_query(ch, "conversations")


def test_tiering_not_applicable_without_warm_volume(schema):
    s = _fresh(schema, "tier").model_copy(update={"tiering_conversations_warm_days": 7})
    report = prepare(s, s.clickhouse_url)
    assert report.storage.tiering.startswith("not applicable")


def test_cluster_ddl_is_replicated_on_cluster():
    for migration in runner.discover():
        for statement in migration.statements(cluster="loom_cluster"):
            if statement.startswith("CREATE TABLE"):
                assert "ON CLUSTER loom_cluster" in statement
                if re.search(r"ENGINE = Null\s*$", statement):
                    continue  # keeps no rows (a feed for materialized views): nothing to replicate
                engine = re.search(r"ENGINE = (\w+)\(([^)]*)\)", statement)
                assert engine and engine.group(1).startswith("Replicated"), statement
                assert "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'" in engine.group(2)
    plain = runner.render(
        "CREATE TABLE t {on_cluster} (a UInt8) ENGINE = ReplacingMergeTree(version) ORDER BY a"
    )
    assert "ON CLUSTER" not in plain and "ENGINE = ReplacingMergeTree(version)" in plain
    rendered = runner.render("ENGINE = MergeTree ORDER BY a", "c")
    assert "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')" in rendered


def test_cluster_name_must_be_identifier():
    import pytest

    with pytest.raises(ValueError):
        runner.render("x {on_cluster}", "a; DROP TABLE t")


def test_vector_tables_upgrade_to_bfloat16_keeping_their_rows(schema, monkeypatch):
    """A store migrated before 004 holds Float32 vector rows; 004 converts them in place
    and the view keeps feeding the table afterwards."""
    s = _fresh(schema, "bf16")
    everything = runner.discover()
    monkeypatch.setattr(runner, "discover", lambda *a, **k: [m for m in everything if m.number < 4])
    prepare(s, s.clickhouse_url)
    ch = connect(s.clickhouse_url, database=s.clickhouse_database)

    def embed_row(msg_id: str, vector: list[float]) -> None:
        ch.insert(
            "conversation_embeddings",
            [["ns", "t", msg_id, "a", "user", "", "", "hello", vector, "m", 1]],
            column_names=[
                "namespace",
                "thread_id",
                "msg_id",
                "agent",
                "role",
                "run_id",
                "user_id",
                "text",
                "embedding",
                "model",
                "version",
            ],
        )

    embed_row("old", [1.0] + [0.0] * 383)
    assert "Array(Float32)" in _create_query(ch, "conversation_vectors_384")
    monkeypatch.setattr(runner, "discover", lambda *a, **k: [m for m in everything if m.number <= 4])
    assert [m.split("_")[0] for m in prepare(s, s.clickhouse_url).applied] == ["004"]
    assert "Array(BFloat16)" in _create_query(ch, "conversation_vectors_384")
    embed_row("new", [0.0, 1.0] + [0.0] * 382)
    rows = ch.query(
        "SELECT msg_id, round(1 - cosineDistance(embedding, [1.0] || arrayWithConstant(383, 0.0)), 3) "
        "FROM conversation_vectors_384 ORDER BY msg_id"
    ).result_rows
    assert rows == [("new", 0.0), ("old", 1.0)]


def test_small_inserts_defer_their_skip_indexes_where_the_server_can(schema):
    ch = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    assert DEFER_SETTING in ch.server_settings  # the embedded engine (26.x) has it
    assert insert_settings(ch, 32, ("idx_user", "idx_run"), "tok") == {
        DEFER_SETTING: "idx_user,idx_run",
        "insert_deduplication_token": "tok",
    }
    assert insert_settings(ch, INDEX_ON_INSERT_MIN_ROWS, ("idx_user",)) is None
    assert insert_settings(ch, 32, ()) is None
    # A server before 25.10 does not know the setting and would refuse the insert.
    older = connect(schema.clickhouse_url, database=schema.clickhouse_database)
    older.server_settings = {k: v for k, v in ch.server_settings.items() if k != DEFER_SETTING}
    assert insert_settings(older, 32, ("idx_user",), "tok") == {"insert_deduplication_token": "tok"}
