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

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import key_sets
from loom.store.rows import column, decoded, json_object, json_text, named, table, table_row

_APPEND_BASE = 2**53  # > any time in microseconds before year 2255, < any clock version in ns


def append_version(ts: datetime) -> int:
    """The version of a thread row an append writes for a turn at `ts`."""
    return _APPEND_BASE - int(ts.timestamp() * 1_000_000)


@table_row
class ThreadRow:
    """A row of loom.threads."""

    namespace: str = column("LowCardinality(String)")
    agent: str = column("LowCardinality(String)")
    thread_id: str = column("String")
    title: str = column("String", default="")
    metadata: dict[str, Any] = column(
        "String", default_factory=dict, encode=json_text, decode=json_object
    )  # JSON
    run_id: str = column("String", default="")
    created_at: datetime | None = column("DateTime64(6, 'UTC')", default=None)
    # Written as created_at when unset (_written()).
    updated_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    tombstoned: bool = column("Bool", default=False)
    version: int = column("UInt64", default=0)

    def row(self) -> list[Any]:
        """The insert values, in :data:`COLUMNS` order."""
        return TABLE.values(_written(self))


def _written(row: ThreadRow) -> ThreadRow:
    return row if row.updated_at is not None else replace(row, updated_at=row.created_at)


TABLE = table("threads", ThreadRow)
COLUMNS = TABLE.insert_names
COLUMN_TYPES = TABLE.insert_types


def insert(ch: Client, rows: Sequence[ThreadRow], *, dedup_token: str = "") -> None:
    settings = {"insert_deduplication_token": dedup_token} if dedup_token else None
    TABLE.insert(ch, [_written(r) for r in rows], settings=settings)


_SELECT = f"SELECT {TABLE.read_list} FROM threads FINAL "


def get(ch: Client, namespace: str, agent: str, thread_id: str) -> ThreadRow | None:
    """The thread's newest row, tombstoned or not (None when it has none)."""
    rows = ch.query(
        _SELECT + "WHERE namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}",
        parameters={"ns": namespace, "ag": agent, "th": thread_id},
    )
    return next(iter(TABLE.rows(rows)), None)


def get_many(
    ch: Client, namespace: str, pairs: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], ThreadRow]:
    """The newest row of each (agent, thread_id) that has one."""
    if not pairs:
        return {}
    rows = ch.query(
        _SELECT + "WHERE namespace = {ns:String} AND agent IN {ag:Array(String)} "
        "AND thread_id IN {th:Array(String)}",
        parameters={"ns": namespace, **key_sets(pairs, ag=0, th=1)},
    )
    wanted = set(pairs)
    return {(r.agent, r.thread_id): r for r in TABLE.rows(rows) if (r.agent, r.thread_id) in wanted}


@dataclass(frozen=True)
class RecentThread:
    agent: str
    thread_id: str
    last_ts: datetime


def recent(
    ch: Client, namespace: str, agent: str | None, since: datetime, *, limit: int, offset: int
) -> list[RecentThread]:
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
    )
    return [decoded(RecentThread, r, {"last_ts": "last"}) for r in named(rows)]
