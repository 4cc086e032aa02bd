"""SQL for loom.namespaces. A namespace with no row records nothing (fails closed)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from clickhouse_connect.driver.client import Client

from loom.clock import next_version


@dataclass(frozen=True)
class NamespaceConfig:
    namespace: str
    conversation_logging_enabled: bool = False
    model_calls_enabled: bool = True
    extraction_policy: str = ""


_COLUMNS = ["namespace", "conversation_logging_enabled", "model_calls_enabled", "extraction_policy", "version"]


def get_many(ch: Client, namespaces: list[str]) -> dict[str, NamespaceConfig]:
    """Every named namespace, with the closed defaults for those that have no row."""
    rows = ch.query(
        "SELECT namespace, conversation_logging_enabled, model_calls_enabled, extraction_policy "
        "FROM namespaces FINAL WHERE namespace IN {ns:Array(String)}",
        parameters={"ns": namespaces},
    ).result_rows
    found = {r[0]: NamespaceConfig(r[0], bool(r[1]), bool(r[2]), r[3]) for r in rows}
    return {ns: found.get(ns, NamespaceConfig(ns)) for ns in namespaces}


def recording(ch: Client, namespaces: list[str]) -> set[str]:
    """The named namespaces whose owner records their transcripts."""
    return {ns for ns, c in get_many(ch, namespaces).items() if c.conversation_logging_enabled}


def get(ch: Client, namespace: str) -> NamespaceConfig:
    return get_many(ch, [namespace])[namespace]


def put(ch: Client, config: NamespaceConfig) -> None:
    ch.insert("namespaces", [[config.namespace, config.conversation_logging_enabled, config.model_calls_enabled,
                              config.extraction_policy, next_version()]], column_names=_COLUMNS)


def update(ch: Client, namespace: str, **changes: object) -> NamespaceConfig:
    config = replace(get(ch, namespace), **changes)  # type: ignore[arg-type]
    put(ch, config)
    return config
