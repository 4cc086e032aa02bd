"""SQL for loom.threads: one row per (namespace, agent, thread_id), revised by a higher
``version``; and the recency list of a namespace's threads.

A thread row written by an append carries :func:`append_version` of the turn's time:
below every clock version (``loom.clock.next_version``, nanoseconds), so a
conversation.create, update or delete always wins over it whatever order the inserts
land in; and higher for an earlier turn, so among append rows the thread's first turn
wins (its created_at stays). That makes the append's thread insert idempotent: it needs
no read first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import key_sets

_APPEND_BASE = 2**53   # > any time in microseconds before year 2255, < any clock version in ns


def append_version(ts: datetime) -> int:
    """The version of a thread row an append writes for a turn at `ts`."""
    return _APPEND_BASE - int(ts.timestamp() * 1_000_000)

COLUMNS = ["namespace", "agent", "thread_id", "title", "metadata", "run_id", "created_at", "updated_at",
           "tombstoned", "version"]
COLUMN_TYPES = ["LowCardinality(String)", "LowCardinality(String)", "String", "String", "String", "String",
                "DateTime64(6, 'UTC')", "DateTime64(3, 'UTC')", "Bool", "UInt64"]


@dataclass
class ThreadRow:
    namespace: str
    agent: str
    thread_id: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    tombstoned: bool = False
    version: int = 0

    def row(self) -> list[Any]:
        return [self.namespace, self.agent, self.thread_id, self.title,
                json.dumps(self.metadata, separators=(",", ":")), self.run_id, self.created_at,
                self.updated_at or self.created_at, self.tombstoned, self.version]


def insert(ch: Client, rows: Sequence[ThreadRow], *, dedup_token: str = "") -> None:
    settings = {"insert_deduplication_token": dedup_token} if dedup_token else None
    ch.insert("threads", [r.row() for r in rows], column_names=COLUMNS, column_type_names=COLUMN_TYPES,
              settings=settings)


def _metadata(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_SELECT = ("SELECT toString(namespace), toString(agent), thread_id, title, metadata, run_id, created_at, "
           "updated_at, tombstoned, version FROM threads FINAL ")


def _row(r: Sequence[Any]) -> ThreadRow:
    return ThreadRow(r[0], r[1], r[2], r[3], _metadata(r[4]), r[5], r[6], r[7], bool(r[8]), int(r[9]))


def get(ch: Client, namespace: str, agent: str, thread_id: str) -> ThreadRow | None:
    """The thread's newest row, tombstoned or not (None when it has none)."""
    rows = ch.query(_SELECT + "WHERE namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}",
                    parameters={"ns": namespace, "ag": agent, "th": thread_id}).result_rows
    return _row(rows[0]) if rows else None


def get_many(ch: Client, namespace: str, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], ThreadRow]:
    """The newest row of each (agent, thread_id) that has one."""
    if not pairs:
        return {}
    rows = ch.query(_SELECT + "WHERE namespace = {ns:String} AND agent IN {ag:Array(String)} "
                    "AND thread_id IN {th:Array(String)}",
                    parameters={"ns": namespace, **key_sets(pairs, ag=0, th=1)}).result_rows
    wanted = set(pairs)
    return {(r[1], r[2]): _row(r) for r in rows if (r[1], r[2]) in wanted}


@dataclass(frozen=True)
class RecentThread:
    agent: str
    thread_id: str
    last_ts: datetime


def recent(ch: Client, namespace: str, agent: str | None, since: datetime, *, limit: int,
           offset: int) -> list[RecentThread]:
    """Threads active since `since`, newest activity first: the time of their newest live
    recorded turn, or, for a thread created up front with no turn yet, its creation.
    Saved-only rows (conversations.SAVED_ONLY) are no thread's activity."""
    agent_filter = "" if agent is None else " AND agent = {ag:String}"
    params: dict[str, Any] = {"ns": namespace, "since": since, "lim": limit, "off": offset}
    if agent is not None:
        params["ag"] = agent
    rows = ch.query(
        "SELECT agent, thread_id, max(last_ts) AS last FROM ("
        "  SELECT toString(agent) AS agent, thread_id, max(ts) AS last_ts FROM conversations FINAL"
        "  WHERE namespace = {ns:String}" + agent_filter + " AND NOT tombstoned AND origin = 'recorded'"
        "  AND ts >= {since:DateTime64(6, 'UTC')}"
        "  GROUP BY agent, thread_id"
        "  UNION ALL"
        "  SELECT toString(agent) AS agent, thread_id, created_at AS last_ts FROM threads FINAL"
        "  WHERE namespace = {ns:String}" + agent_filter + " AND NOT tombstoned"
        "  AND created_at >= {since:DateTime64(6, 'UTC')}"
        ") GROUP BY agent, thread_id ORDER BY last DESC, agent, thread_id "
        "LIMIT {lim:UInt32} OFFSET {off:UInt32}",
        parameters=params,
    ).result_rows
    return [RecentThread(r[0], r[1], r[2]) for r in rows]
