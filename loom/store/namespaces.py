"""SQL for loom.namespaces. A namespace with no row records nothing (fails closed)."""

from __future__ import annotations

from dataclasses import replace

from clickhouse_connect.driver.client import Client

from loom.clock import next_version
from loom.store.rows import VERSION, Column, column, frozen_table_row, table


@frozen_table_row
class NamespaceConfig:
    """A row of loom.namespaces: a namespace's switches (its ``version`` is the writer's)."""

    namespace: str = column("String")
    conversation_logging_enabled: bool = column("Bool", default=False)
    model_calls_enabled: bool = column("Bool", default=True)
    extraction_policy: str = column("String", default="")


TABLE = table(
    "namespaces",
    NamespaceConfig,
    extra=[VERSION],
    server=[Column("updated_at", "DateTime64(3, 'UTC')")],
)


def get_many(ch: Client, namespaces: list[str]) -> dict[str, NamespaceConfig]:
    """Every named namespace, with the closed defaults for those that have no row."""
    rows = TABLE.select(ch, "WHERE namespace IN {ns:Array(String)}", {"ns": namespaces})
    found = {r.namespace: r for r in rows}
    return {ns: found.get(ns, NamespaceConfig(namespace=ns)) for ns in namespaces}


def recording(ch: Client, namespaces: list[str]) -> set[str]:
    """The named namespaces whose owner records their transcripts."""
    return {ns for ns, c in get_many(ch, namespaces).items() if c.conversation_logging_enabled}


def get(ch: Client, namespace: str) -> NamespaceConfig:
    return get_many(ch, [namespace])[namespace]


def put(ch: Client, config: NamespaceConfig) -> None:
    TABLE.insert(ch, [config], version=next_version())


def update(ch: Client, namespace: str, **changes: object) -> NamespaceConfig:
    config = replace(get(ch, namespace), **changes)  # type: ignore[arg-type]  # the callers name fields; replace() checks them
    put(ch, config)
    return config
