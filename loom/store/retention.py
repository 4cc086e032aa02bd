"""What the server reports about retention and tiering: each table's TTL and storage
policy (system.tables), and the volumes of each policy (system.storage_policies)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from loom.store.rows import decoded, named

_TTL = re.compile(r"\sTTL\s(.*?)(?:\sSETTINGS\s|$)", re.S)


@dataclass(frozen=True)
class TableStorage:
    table: str
    engine: str
    ttl: str  # the TTL clause as the server renders it ('' = none)
    storage_policy: str
    volumes: list[str]


def ttl_of(engine_full: str) -> str:
    m = _TTL.search(engine_full)
    return m.group(1).strip() if m else ""


def tables(ch: Client) -> list[TableStorage]:
    """Every MergeTree table of Loom's database."""
    rows = ch.query(
        "SELECT t.name AS table_name, t.engine AS engine_name, t.engine_full AS engine_text, "
        "t.storage_policy AS policy, arraySort(groupArrayIf(p.volume_name, p.volume_name != '')) AS volumes "
        "FROM system.tables AS t LEFT JOIN system.storage_policies AS p ON p.policy_name = t.storage_policy "
        "WHERE t.database = currentDatabase() AND t.engine LIKE '%MergeTree%' "
        "GROUP BY t.name, t.engine, t.engine_full, t.storage_policy ORDER BY t.name"
    )
    return [
        decoded(
            TableStorage,
            r,
            {"table": "table_name", "engine": "engine_name", "storage_policy": "policy"},
            ttl=ttl_of(r["engine_text"]),
            volumes=list(r["volumes"]),
        )
        for r in named(rows)
    ]
