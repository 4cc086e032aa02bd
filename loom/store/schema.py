"""Bringing a database up to date: migrations plus the retention/tiering TTL."""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_schema import runner
from loom.settings import Settings
from loom.store.clickhouse import connect


@dataclass(frozen=True)
class SchemaReport:
    applied: list[str]
    storage: runner.StorageReport


def prepare(settings: Settings, clickhouse_url: str) -> SchemaReport:
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
    applied = runner.migrate(ch, settings.clickhouse_cluster)
    storage = runner.apply_storage_rules(
        ch,
        settings.retention_conversations_days,
        settings.tiering_conversations_warm_days,
        settings.clickhouse_cluster,
    )
    return SchemaReport([f"{m.number:03d}_{m.name}" for m in applied], storage)
