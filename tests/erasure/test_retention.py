"""Retention and tiering on the embedded engine: the transcript's TTL reaches the
saved-message indexes and the transcript's postings (nothing of an expired turn's text stays readable but its
embedding row), parts move to a 'warm' volume under a two-disk storage policy, and
retention.show / `loom retention show` report what the server has in force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

from clickhouse_schema.runner import apply_storage_rules
from loom.clock import next_version
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from tests.conversation.helpers import ok

LOOM = [sys.executable, "-m", "loom.cli.main"]
DERIVED = ("conversations", "saved_docs", "saved_terms", "conversation_terms")


def _turn(ns: str, msg: str, content: str, ts: datetime) -> conv_store.Turn:
    return conv_store.Turn(
        namespace=ns,
        agent="a",
        thread_id="t",
        msg_id=msg,
        ts=ts,
        role="user",
        content=content,
        user_id="u",
        is_saved=True,
        saved_at=ts,
        version=next_version(),
    )


def _emb(ns: str, msg: str, text: str, ts: datetime) -> emb_store.EmbeddingRow:
    return emb_store.EmbeddingRow(
        namespace=ns,
        thread_id="t",
        msg_id=msg,
        agent="a",
        role="user",
        run_id="",
        user_id="u",
        ts=ts,
        text=text,
        embedding=[0.1] * 384,
        model="fake",
        is_saved=True,
        saved_at=ts,
        version=next_version(),
    )


def _readable(ch, ns: str, needle: str) -> dict[str, int]:
    """Per table, rows of the namespace holding `needle` in their text or terms."""
    out = {}
    for table, column in (
        ("conversations", "content"),
        ("saved_docs", "content"),
        ("saved_terms", "term"),
        ("conversation_terms", "term"),
        ("conversation_embeddings", "text"),
    ):
        out[table] = int(
            ch.query(
                f"SELECT count() FROM {table} WHERE namespace = {{ns:String}} "
                f"AND position({column}, {{n:String}}) > 0",
                parameters={"ns": ns, "n": needle},
            ).result_rows[0][0]
        )
    return out


async def test_an_expired_turn_leaves_every_table_but_its_embedding_row(call, ns, mint, services):
    ch = services.ch
    now = datetime.now(UTC)
    old, new = now - timedelta(days=45), now - timedelta(days=1)
    conv_store.insert(
        ch,
        [
            _turn(ns, "old", "zanzibarquux expired words", old),
            _turn(ns, "new", "recentquux fresh words", new),
        ],
    )
    emb_store.insert(
        ch,
        [_emb(ns, "old", "zanzibarquux expired words", old), _emb(ns, "new", "recentquux fresh words", new)],
    )
    assert _readable(ch, ns, "zanzibarquux") == {
        "conversations": 1,
        "saved_docs": 1,
        "saved_terms": 1,
        "conversation_terms": 1,
        "conversation_embeddings": 1,
    }
    apply_storage_rules(ch, 30, 0)
    try:
        report = await ok(call, "retention.show", mint(ns, "admin"))
        ttls = {t["table"]: t["ttl"] for t in report["tables"]}
        for table in DERIVED:
            assert "toIntervalDay(30)" in ttls[table], (table, ttls[table])
        assert ttls["conversation_embeddings"] == ""
        assert report["retention_days"] == services.settings.retention_conversations_days
        for table in DERIVED:
            ch.command(f"ALTER TABLE {table} MATERIALIZE TTL", settings={"mutations_sync": 2})
        # Gone from disk (not only hidden): a read that ignores lightweight-delete masks finds nothing.
        gone = _readable(ch, ns, "zanzibarquux")
        assert gone == {
            "conversations": 0,
            "saved_docs": 0,
            "saved_terms": 0,
            "conversation_terms": 0,
            "conversation_embeddings": 1,
        }
        assert _readable(ch, ns, "recentquux") == {
            "conversations": 1,
            "saved_docs": 1,
            "saved_terms": 1,
            "conversation_terms": 1,
            "conversation_embeddings": 1,
        }
    finally:
        apply_storage_rules(ch, 0, 0)
    report = await ok(call, "retention.show", mint(ns, "admin"))
    assert all(t["ttl"] == "" for t in report["tables"] if t["table"] in DERIVED)
    assert report["tiering"]["applies"] is False


_TIERING = """
import json, sys, time
import chdb
from clickhouse_schema.runner import conversations_ttl, discover

home = sys.argv[1]
conn = chdb.connect(f"file:{home}/data?config-file={home}/config.xml")
conn.query("CREATE DATABASE IF NOT EXISTS loom")
conn.query("USE loom")
ddl = next(s for s in discover()[0].statements() if "TABLE IF NOT EXISTS conversations" in s)
conn.query(ddl)
conn.query("ALTER TABLE conversations MODIFY SETTING storage_policy = 'loom_tiered'")
conn.query("ALTER TABLE conversations MODIFY TTL " + ", ".join(conversations_ttl(365, 30)))
for msg, days in (("hot", 1), ("warm", 60), ("expired", 400)):
    conn.query("INSERT INTO conversations (namespace, agent, thread_id, msg_id, ts, role, content, version) "
               f"VALUES ('n', 'a', 't', '{msg}', now64(6) - INTERVAL {days} DAY, 'user', 'text', 1)")
conn.query("ALTER TABLE conversations MATERIALIZE TTL SETTINGS mutations_sync = 2")
rows = conn.query("SELECT msg_id, _disk_name FROM conversations ORDER BY msg_id", "JSONEachRow").bytes().decode()
policy = conn.query("SELECT policy_name, volume_name FROM system.storage_policies "
                    "WHERE policy_name = 'loom_tiered' ORDER BY volume_priority", "JSONEachRow").bytes().decode()
print(json.dumps({"rows": [json.loads(x) for x in rows.splitlines()],
                  "volumes": [json.loads(x)["volume_name"] for x in policy.splitlines()]}))
"""

_CONFIG = """
<clickhouse><storage_configuration>
  <disks><warm><path>{home}/warm/</path></warm></disks>
  <policies><loom_tiered><volumes>
    <default><disk>default</disk></default><warm><disk>warm</disk></warm>
  </volumes></loom_tiered></policies>
</storage_configuration></clickhouse>
"""


def test_the_embedded_engine_moves_old_transcript_parts_to_the_warm_volume(tmp_path: Path):
    """The embedded engine takes a two-disk storage policy (chdb reads a server config
    from the file: URI's config-file parameter); the TTL Loom renders moves a part of
    60-day-old turns to 'warm', keeps a fresh one on the default disk and deletes one
    past retention. Its own process: chdb runs one engine per process."""
    (tmp_path / "warm").mkdir()
    (tmp_path / "config.xml").write_text(_CONFIG.format(home=tmp_path))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TIERING), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=root,
        env={**os.environ, "TZ": "UTC"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["volumes"] == ["default", "warm"]
    assert {r["msg_id"]: r["_disk_name"] for r in got["rows"]} == {"hot": "default", "warm": "warm"}
    assert any((tmp_path / "warm").rglob("*.bin")) or any((tmp_path / "warm").rglob("data.*"))


def _cli_env(services) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    s = services.settings
    env.update(
        LOOM_HOME=str(s.home),
        LOOM_EMBEDDER="fake",
        LOOM_CLICKHOUSE_URL=s.clickhouse_url,
        LOOM_CLICKHOUSE_DATABASE=s.clickhouse_database,
        LOOM_REDIS_URL=s.redis_url,
    )
    return env


async def test_loom_retention_show_and_erasure_export_commands(call, ns, writer, services):
    for i in range(3):
        await ok(
            call,
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="user",
            content=f"turn {i} of u1",
            user_id="u1",
        )
    shown = subprocess.run(
        [*LOOM, "retention", "show", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_cli_env(services),
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    report = json.loads(shown.stdout)
    assert {t["table"] for t in report["tables"]} >= {
        "conversations",
        "saved_docs",
        "conversation_embeddings",
    }
    assert report["tiering"]["applies"] is False
    exported = subprocess.run(
        [*LOOM, "erasure", "export", "--user", "u1", "--namespace", ns, "--page-rows", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_cli_env(services),
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    lines = [json.loads(x) for x in exported.stdout.splitlines()]
    assert [x["kind"] for x in lines] == ["export", "turn", "turn", "turn", "end"]
    assert lines[-1]["rows"] == 3 and "3 rows" in exported.stderr
