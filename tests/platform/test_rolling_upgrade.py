"""Rolling upgrades: processes of two builds share one store during a deploy.

Every API and worker process registers its build, schema and capabilities (loom.replicas);
saving pauses while a live replica lacks saved_state_preserved_in_compaction; a process
refuses a database migrated by a newer build; a migration that changes what writers write
waits for older writers to be gone."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis import Redis as SyncRedis

from clickhouse_schema import runner
from loom import replicas
from loom.redis_keys import REPLICAS
from loom.sdk.agent import Agent
from loom.settings import Settings
from loom.store.clickhouse import connect
from loom.store.schema import prepare


@contextmanager
def old_replica(redis_url: str, schema: int, *capabilities: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.platform.old_replica", redis_url, str(schema), *capabilities],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    replica_id = proc.stdout.readline().strip()  # registered
    try:
        yield proc
    finally:
        if proc.poll() is None:  # a clean stop deregisters: the suite's saves go on after it
            proc.terminate()
            proc.wait(timeout=10)
        SyncRedis.from_url(redis_url).hdel(REPLICAS, replica_id)


async def _save(call, token, ns, message_id):
    return await call(
        "conversation.save_message",
        token,
        namespace=ns,
        user_id="u1",
        conversation_id="c1",
        message_id=message_id,
        role="user",
        content=f"remember the ledger cutover {message_id}",
    )


async def test_saving_pauses_while_a_replica_lacks_the_capability(call, api, mint, ns, services, monkeypatch):
    monkeypatch.setattr(replicas, "LIVE_WINDOW_S", 2.0)  # how this reader judges a silent replica gone
    writer = mint(ns, "writer")
    replicas.forget_cache()
    assert (await _save(call, writer, ns, "m0")).status_code == 200
    with old_replica(services.settings.redis_url, runner.newest_known()) as old:
        replicas.forget_cache()
        refused = await _save(call, writer, ns, "m1")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "15"
        body = refused.json()
        assert body["error"] == "replica_lacks_capability" and body["capability"] == replicas.SAVED_STATE
        shown = (await call("replicas.show", mint(ns, "viewer"))).json()
        assert replicas.SAVED_STATE not in shown["capabilities"] and shown["replicas"] is None
        admin_view = (await call("replicas.show", mint(ns, "admin"))).json()
        assert any(r["kind"] == "api-old" and r["capabilities"] == [] for r in admin_view["replicas"])
        # Reads and unsaves go on: only a new save could be lost to the older build.
        listed = await call("conversation.list_saved_messages", writer, namespace=ns, user_id="u1")
        assert listed.status_code == 200 and len(listed.json()["messages"]) == 1
        # The dashboard hides "save" meanwhile, and says why.
        panel = await api.get(
            "/dashboard/saved", params={"ns": ns, "user": "u1"}, cookies={"loom_dashboard": writer}
        )
        assert 'id="saving-paused"' in panel.text and 'id="save"' not in panel.text
        async with Agent(
            ns, "test", "bot", base_url="http://loom.test", token=writer, http_transport=api._transport
        ) as bot:
            assert await bot.saved.available() is False  # the SDK's clients hide "save" meanwhile
        old.kill()  # dies without deregistering: gone once its heartbeat is old
        old.wait()
    await asyncio.sleep(2.5)
    replicas.forget_cache()
    assert (await _save(call, writer, ns, "m2")).status_code == 200
    panel = await api.get(
        "/dashboard/saved", params={"ns": ns, "user": "u1"}, cookies={"loom_dashboard": writer}
    )
    assert 'id="saving-paused"' not in panel.text and 'id="save"' in panel.text


async def test_a_replica_that_stops_cleanly_leaves_at_once(call, api, mint, ns, services):
    writer = mint(ns, "writer")
    with old_replica(services.settings.redis_url, runner.newest_known()) as old:
        replicas.forget_cache()
        assert (await _save(call, writer, ns, "m1")).status_code == 503
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=10) == 0
    replicas.forget_cache()
    assert (await _save(call, writer, ns, "m1")).status_code == 200
    healthz = await api.get("/healthz", headers={"Authorization": f"Bearer {writer}"})
    assert replicas.SAVED_STATE in healthz.json()["capabilities"]
    assert "capabilities" not in (await api.get("/healthz")).json()  # only for a valid token


@pytest.fixture
def fresh_db(settings: Settings) -> Iterator[Settings]:
    """A database of its own (a schema test must not change the suite's)."""
    own = settings.model_copy(update={"clickhouse_database": f"loom_up_{secrets.token_hex(4)}"})
    yield own
    connect(settings.clickhouse_url, database="default").command(
        f"DROP DATABASE IF EXISTS {own.clickhouse_database}"
    )


def test_a_process_refuses_a_schema_newer_than_it_knows(fresh_db):
    prepare(fresh_db, fresh_db.clickhouse_url)
    ch = connect(fresh_db.clickhouse_url, database=fresh_db.clickhouse_database)
    runner.check_not_newer(ch)  # as migrated by this build: fine
    ch.insert(
        runner.MIGRATIONS_TABLE,
        [[runner.newest_known() + 1, "from_the_future"]],
        column_names=["number", "name"],
    )
    with pytest.raises(runner.SchemaTooNew, match="newer than this build knows"):
        runner.check_not_newer(ch)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        LOOM_CLICKHOUSE_URL=fresh_db.clickhouse_url,
        LOOM_CLICKHOUSE_DATABASE=fresh_db.clickhouse_database,
        LOOM_HOME=str(fresh_db.home),
    )
    for command in (["migrate"], ["worker"]):
        out = subprocess.run(
            [sys.executable, "-m", "loom.cli.main", *command],
            env={**env, "LOOM_REDIS_URL": fresh_db.redis_url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode != 0, command
        assert "newer than this build knows" in out.stdout + out.stderr, command


def test_a_writers_must_upgrade_migration_waits_for_older_writers(fresh_db):
    marked = [m for m in runner.discover() if m.writers_must_upgrade]
    assert [m.number for m in marked][:2] == [6, 7]
    with old_replica(fresh_db.redis_url, 5):
        with pytest.raises(runner.MigrationBlocked, match="006_vectors_owner_ts") as refused:
            prepare(fresh_db, fresh_db.clickhouse_url, redis_url=fresh_db.redis_url)
        assert "(schema 005)" in str(refused.value)
        ch = connect(fresh_db.clickhouse_url, database=fresh_db.clickhouse_database)
        assert max(runner.applied(ch)) == 5  # stopped before it, nothing of it applied
        report = prepare(fresh_db, fresh_db.clickhouse_url, redis_url=fresh_db.redis_url, force=True)
        assert report.applied and report.applied[0].startswith("006")
