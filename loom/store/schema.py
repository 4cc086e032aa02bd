"""Bringing a database up to date: migrations plus the retention/tiering TTL."""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_connect.driver.client import Client
from redis import Redis as SyncRedis

from clickhouse_schema import runner
from loom import logging as loom_logging
from loom import replicas
from loom.settings import Settings
from loom.store import settings_overrides as overrides
from loom.store.clickhouse import connect

log = loom_logging.get("loom.schema")


@dataclass(frozen=True)
class SchemaReport:
    applied: list[str]
    storage: runner.StorageReport


def older_writers(redis_url: str) -> runner.Blockers:
    """Who, among the live replicas registered in Redis, writes a schema older than a
    migration's number."""

    def blockers(number: int) -> list[str]:
        client = SyncRedis.from_url(redis_url)
        try:
            return [
                f"{r.replica_id} (schema {r.schema:03d})"
                for r in replicas.live_sync(client)
                if r.schema < number
            ]
        finally:
            client.close()

    return blockers


def prepare(
    settings: Settings, clickhouse_url: str, *, redis_url: str = "", force: bool = False
) -> SchemaReport:
    """Migrate and apply the storage rules. With `redis_url`, a migration that changes what
    writers write waits for older live replicas to be gone (unless `force`)."""
    bootstrap = connect(
        clickhouse_url,
        database="default",
        user=settings.clickhouse_user,
        password=settings.clickhouse_password,
    )
    runner.wait_for(bootstrap)
    on_cluster = runner.render(" {on_cluster}", settings.clickhouse_cluster)
    if not runner._IDENT.match(settings.clickhouse_database):
        raise ValueError(
            f"LOOM_CLICKHOUSE_DATABASE must be a plain identifier, got {settings.clickhouse_database!r}"
        )
    bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {settings.clickhouse_database}{on_cluster}")
    ch = connect(
        clickhouse_url,
        database=settings.clickhouse_database,
        user=settings.clickhouse_user,
        password=settings.clickhouse_password,
    )
    blockers = older_writers(redis_url) if redis_url else None
    if force:
        log.warning("migrations forced past older live writers", redis=bool(redis_url))
    applied = runner.migrate(ch, settings.clickhouse_cluster, blockers=blockers, force=force)
    # An admin's stored override of retention or tiering wins over the environment here
    # too, or a restart would put the environment's TTL back.
    effective = _with_stored_overrides(settings, ch)
    storage = runner.apply_storage_rules(
        ch,
        effective.retention_conversations_days,
        effective.tiering_conversations_warm_days,
        settings.clickhouse_cluster,
    )
    return SchemaReport([f"{m.number:03d}_{m.name}" for m in applied], storage)


def _with_stored_overrides(settings: Settings, ch: Client) -> Settings:
    from loom.ops.platform import live_settings  # the live settings' own validation (ops layer)

    if not ch.command(f"EXISTS TABLE {overrides.TABLE.name}"):  # a run that stops short of 011 (tests)
        return settings
    return live_settings.with_overrides(settings, settings, live_settings.in_force(overrides.live(ch)))
