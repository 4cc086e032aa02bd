"""SQL of loom.memory_evidence: the messages and observations an extraction read, and
memory.recall's reads over them (BM25 from evidence_terms, and time windows).

A row that reads as high keeps no text (content '', high_sensitivity true); reads never
return it. Evidence is keyed by (namespace, user_id, evidence_id), the id derived from
the scope and the message's id, so posting the same message again writes the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.memories import Scope, bm25


@dataclass
class Evidence:
    namespace: str
    user_id: str
    evidence_id: str
    session_id: str
    run_id: str
    source: str
    msg_id: str
    role: str
    content: str
    high_sensitivity: bool
    ts: datetime
    created_at: datetime
    tombstoned: bool = False
    version: int = 0


COLUMNS = (
    "namespace",
    "user_id",
    "evidence_id",
    "session_id",
    "run_id",
    "source",
    "msg_id",
    "role",
    "content",
    "high_sensitivity",
    "ts",
    "created_at",
    "tombstoned",
    "version",
)
_READ = ", ".join(f"toString({c})" if c in ("namespace", "source", "role") else c for c in COLUMNS)


def _row(r: Sequence[Any]) -> Evidence:
    d = dict(zip(COLUMNS, r, strict=True))
    d["high_sensitivity"], d["tombstoned"] = bool(d["high_sensitivity"]), bool(d["tombstoned"])
    return Evidence(**d)


def insert(ch: Client, rows: Sequence[Evidence]) -> None:
    if rows:
        ch.insert(
            "memory_evidence", [[getattr(e, c) for c in COLUMNS] for e in rows], column_names=list(COLUMNS)
        )


def get(ch: Client, namespace: str, user_id: str, ids: Sequence[str]) -> list[Evidence]:
    """The newest live versions of the named rows, oldest message first."""
    if not ids:
        return []
    rows = ch.query(
        f"SELECT {_READ} FROM memory_evidence FINAL WHERE namespace = {{ns:String}} AND user_id = {{u:String}} "
        "AND evidence_id IN {ids:Array(String)} AND NOT tombstoned ORDER BY ts, evidence_id",
        parameters={"ns": namespace, "u": user_id, "ids": list(ids)},
    ).result_rows
    return [_row(r) for r in rows]


def _window(since: datetime | None, until: datetime | None) -> tuple[str, dict[str, Any]]:
    cond, params = "", {}
    if since is not None:
        cond += " AND ts >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')"
        params["since"] = int(since.timestamp() * 1_000_000)
    if until is not None:
        cond += " AND ts < fromUnixTimestamp64Micro({until:Int64}, 'UTC')"
        params["until"] = int(until.timestamp() * 1_000_000)
    return cond, params


def recent(
    ch: Client,
    scope: Scope,
    *,
    limit: int,
    since: datetime | None = None,
    until: datetime | None = None,
    source: str | None = None,
) -> list[Evidence]:
    """The scope's readable evidence in the time window, newest first."""
    cond, params = _window(since, until)
    if source is not None:
        cond += " AND source = {src:String}"
        params["src"] = source
    rows = ch.query(
        f"SELECT {_READ} FROM memory_evidence FINAL WHERE {scope.where()} AND NOT tombstoned "
        f"AND NOT high_sensitivity {cond} ORDER BY ts DESC, evidence_id LIMIT {{lim:UInt32}}",
        parameters=scope.params() | params | {"lim": limit},
    ).result_rows
    return [_row(r) for r in rows]


def search(
    ch: Client,
    scope: Scope,
    query: str,
    *,
    limit: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[tuple[Evidence, float, tuple[str, ...]]]:
    """BM25 of `query` over the scope's readable evidence in the time window, best first."""
    cond, params = _window(since, until)
    hits = bm25(ch, scope, query, limit=limit, table="memory_evidence", extra=cond, extra_params=params)
    by_id = {e.evidence_id: e for e in get(ch, scope.namespace, scope.user_id, [h.id for h in hits])}
    return [
        (by_id[h.id], h.score, h.matched) for h in hits if h.id in by_id and not by_id[h.id].high_sensitivity
    ]
