"""SQL for loom.conversations: the verbatim turns, one row per (namespace, agent,
thread_id, msg_id), revised (saved flag, tombstone) by a higher ``version``.

Reads use FINAL so the newest version wins, and drop tombstoned rows, except on the
write path: its existence check counts any version (a tombstoned turn has still
landed), and its state re-read picks the newest version itself (cheaper than FINAL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store import transcript_postings
from loom.store.clickhouse import insert_settings, key_sets
from loom.store.keys import EmbKey, TurnKey
from loom.store.rows import (
    INSERTED_AT,
    column,
    decoded,
    json_object,
    json_text,
    named,
    table,
    table_row,
)

# How a row came to exist (column `origin`, migration 007). A recorded row is part of the
# namespace's transcript; a saved-only row was stored by conversation.save_message alone
# and belongs to the user who saved it: only the saved-message ops (and erasure's
# export) read it. Every writer of a new version of a row carries its origin over.
RECORDED = "recorded"
SAVED_ONLY = "saved"
# The condition every transcript read of the namespace's turns adds (search, threads,
# get, list): saved-only rows are not part of the transcript.
IS_RECORDED = "origin = 'recorded'"


@table_row
class Turn:
    """A row of loom.conversations (every column but the server's ``created_at``)."""

    namespace: str = column("LowCardinality(String)")
    agent: str = column("LowCardinality(String)")
    thread_id: str = column("String")
    msg_id: str = column("String")
    ts: datetime = column("DateTime64(6, 'UTC')")
    role: str = column("LowCardinality(String)")
    content: str = column("String")
    reasoning: str = column("String", default="")
    user_id: str = column("String", default="")
    run_id: str = column("String", default="")
    metadata: dict[str, Any] = column(
        "String", default_factory=dict, encode=json_text, decode=json_object
    )  # a JSON object
    tokens: int | None = column("Nullable(UInt32)", default=None)
    high_sensitivity: bool = column("Bool", default=False)
    is_summary: bool = column("Bool", default=False)
    is_saved: bool = column("Bool", default=False)
    saved_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)
    tombstoned: bool = column("Bool", default=False)
    tombstoned_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)
    tombstone_reason: str = column("LowCardinality(String)", default="")
    origin: str = column("LowCardinality(String)", default=RECORDED)
    # The token that appended the turn (migration 013; '' when none did): a writer may
    # delete the turns it appended (conversation.delete_message).
    appended_by: str = column("String", default="")
    version: int = column("UInt64", default=0)

    @property
    def key(self) -> TurnKey:
        return TurnKey(self.namespace, self.agent, self.thread_id, self.msg_id)

    def row(self) -> list[Any]:
        """The insert values, in :data:`COLUMNS` order."""
        return TABLE.values(self)


TABLE = table("conversations", Turn, server=[INSERTED_AT])
# Given to every insert, so the client does not ask the server to DESCRIBE the table first.
COLUMNS = TABLE.insert_names
COLUMN_TYPES = TABLE.insert_types


def newest(ch: Client, where_sql: str, parameters: dict[str, Any]) -> list[Turn]:
    """The newest version of every turn `where_sql` selects, oldest first ((ts, msg_id) order)."""
    return TABLE.select(ch, f"WHERE {where_sql} ORDER BY ts, msg_id", parameters)


# Left to the merges by small inserts (loom.store.clickhouse.insert_settings). idx_created
# (the recovery pass's, migration 008) too: a fresh part is one the pass reads anyway.
DEFERRED_INDEXES = ("idx_user", "idx_run", "idx_created")


def insert(ch: Client, turns: Sequence[Turn], *, dedup_token: str = "") -> None:
    """One INSERT for the batch, after its postings (loom.store.transcript_postings). A
    retry with the same token cannot double its rows."""
    transcript_postings.insert(ch, turns, dedup_token=dedup_token)
    settings = insert_settings(ch, len(turns), DEFERRED_INDEXES, dedup_token)
    TABLE.insert(ch, turns, settings=settings)


@dataclass
class Landed:
    """Which of some turns already landed, read before a flush inserts them."""

    existing: set[TurnKey]  # landed for this agent (any version)
    # (ns, thread, msg) that another agent's copy landed for: only such a turn can have
    # an embedding row to reuse (the embedding row is written after, and for, a
    # transcript row).
    elsewhere: set[EmbKey]
    # Landed for this agent as a saved-only row (its newest version): an append of the
    # turn while the namespace records makes it recorded (loom.ops.conversation.writing.origin).
    saved_only: set[TurnKey] = field(default_factory=set)


def landed(ch: Client, keys: Iterable[TurnKey]) -> Landed:
    """Which copies of the turns already landed, this agent's or another's. No FINAL:
    any version counts (a tombstoned turn has still landed)."""
    keys = list(keys)
    if not keys:
        return Landed(set(), set())
    # Every agent's copy is read (no agent filter): the agents of a namespace are few,
    # and the other agents' copies tell which turns may have a vector to reuse.
    rows = ch.query(
        "SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, toString(origin) AS orig, version "
        "FROM conversations "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)} "
        # A few rows: one thread is enough, and spares the engine ~0.5 ms of CPU.
        "SETTINGS max_threads = 1",
        parameters=key_sets(keys, ns=0, th=2, ids=3),
    )
    wanted = set(keys)
    out = Landed(set(), set())
    newest: dict[TurnKey, tuple[int, str]] = {}
    for r in named(rows):
        key = (r["ns"], r["ag"], r["thread_id"], r["msg_id"])
        if key in wanted:
            out.existing.add(key)
            if key not in newest or r["version"] >= newest[key][0]:
                newest[key] = (r["version"], r["orig"])
        else:
            out.elsewhere.add(EmbKey(r["ns"], r["thread_id"], r["msg_id"]))
    out.saved_only = {k for k, (_, origin) in newest.items() if origin == SAVED_ONLY}
    return out


@dataclass(frozen=True)
class TurnState:
    """A transcript row's state as it reads now (for the embedding write under the lease)."""

    tombstoned: bool
    is_saved: bool
    saved_at: datetime | None
    user_id: str = ""  # the owner: a save may have claimed the row since it was appended
    origin: str = RECORDED


def states(ch: Client, keys: Iterable[TurnKey]) -> dict[TurnKey, TurnState]:
    """The newest version of each named turn (keys not found are absent).

    Every version is read and the newest picked here, instead of FINAL: on a table
    that takes a part per append flush, FINAL's merge of the parts' ranges costs the
    engine about twice a plain read of the few rows."""
    keys = list(keys)
    if not keys:
        return {}
    rows = ch.query(
        "SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, tombstoned, is_saved, saved_at, "
        "version, user_id, toString(origin) AS orig FROM conversations WHERE namespace IN {ns:Array(String)} AND agent IN {ag:Array(String)} "
        "AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters=key_sets(keys, ns=0, ag=1, th=2, ids=3),
    )
    wanted = set(keys)
    newest: dict[TurnKey, tuple[int, TurnState]] = {}
    for r in named(rows):
        key = (r["ns"], r["ag"], r["thread_id"], r["msg_id"])
        if key in wanted and (key not in newest or r["version"] >= newest[key][0]):
            newest[key] = (
                r["version"],
                decoded(TurnState, r, {"origin": "orig"}),
            )
    return {key: state for key, (_, state) in newest.items()}


def page(
    ch: Client,
    namespace: str,
    agent: str,
    thread_id: str,
    *,
    limit: int,
    descending: bool = False,
    after: tuple[int, str] | None = None,
    run_id: str | None = None,
) -> list[Turn]:
    """A thread's live recorded turns in (ts, msg_id) order, after a keyset position (ts in µs, msg_id)."""
    where = [
        "namespace = {ns:String}",
        "agent = {ag:String}",
        "thread_id = {th:String}",
        "NOT tombstoned",
        IS_RECORDED,
    ]
    params: dict[str, Any] = {"ns": namespace, "ag": agent, "th": thread_id, "lim": limit}
    if run_id is not None:
        where.append("run_id = {run:String}")
        params["run"] = run_id
    if after is not None:
        op = "<" if descending else ">"
        where.append(f"(toUnixTimestamp64Micro(ts), msg_id) {op} ({{cts:Int64}}, {{cmsg:String}})")
        params["cts"], params["cmsg"] = after
    direction = "DESC" if descending else "ASC"
    rows = ch.query(
        f"SELECT {TABLE.read_list} FROM conversations FINAL WHERE {' AND '.join(where)} "
        f"ORDER BY ts {direction}, msg_id {direction} LIMIT {{lim:UInt32}}",
        parameters=params,
    )
    return TABLE.rows(rows)


@dataclass(frozen=True)
class ThreadActivity:
    turns: int
    first_ts: datetime | None
    last_ts: datetime | None


def activity(ch: Client, namespace: str, agent: str, thread_id: str) -> ThreadActivity:
    row = ch.query(
        "SELECT count() AS turns, min(ts) AS first_ts, max(ts) AS last_ts FROM conversations FINAL "
        f"WHERE namespace = {{ns:String}} AND agent = {{ag:String}} AND thread_id = {{th:String}} AND NOT tombstoned "
        f"AND {IS_RECORDED}",
        parameters={"ns": namespace, "ag": agent, "th": thread_id},
    ).first_item
    assert row is not None  # an aggregate without GROUP BY returns one row
    count = int(row["turns"])
    return ThreadActivity(
        turns=count, first_ts=row["first_ts"] if count else None, last_ts=row["last_ts"] if count else None
    )


@dataclass(frozen=True)
class LastTurn:
    msg_id: str
    role: str
    ts: datetime
    head: str  # the first `chars` characters of the content


def last_turns(
    ch: Client, namespace: str, pairs: Sequence[tuple[str, str]], chars: int
) -> dict[tuple[str, str], LastTurn]:
    """The newest live recorded turn of each (agent, thread_id), with its content's first `chars` characters."""
    if not pairs:
        return {}
    rows = ch.query(
        "SELECT toString(agent) AS ag, thread_id, argMax(msg_id, (ts, msg_id)) AS last_msg, "
        "toString(argMax(role, (ts, msg_id))) AS last_role, max(ts) AS last_ts, "
        "argMax(leftUTF8(content, {n:UInt32}), (ts, msg_id)) AS head "
        "FROM conversations FINAL WHERE namespace = {ns:String} AND agent IN {ag:Array(String)} "
        f"AND thread_id IN {{th:Array(String)}} AND NOT tombstoned AND {IS_RECORDED} GROUP BY agent, thread_id",
        parameters={"ns": namespace, "n": chars, **key_sets(pairs, ag=0, th=1)},
    )
    wanted = set(pairs)
    return {
        (r["ag"], r["thread_id"]): decoded(
            LastTurn, r, {"msg_id": "last_msg", "role": "last_role", "ts": "last_ts"}
        )
        for r in named(rows)
        if (r["ag"], r["thread_id"]) in wanted
    }


def copy_texts(ch: Client, keys: Iterable[EmbKey]) -> dict[EmbKey, list[tuple[str, bool]]]:
    """Every agent's copy of the named turns (newest versions, tombstoned included): the
    whole content and its high mark, per (namespace, thread_id, msg_id)."""
    keys = list(keys)
    if not keys:
        return {}
    rows = ch.query(
        "SELECT toString(namespace) AS ns, thread_id, msg_id, content, high_sensitivity FROM conversations FINAL "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    )
    wanted = set(keys)
    out: dict[EmbKey, list[tuple[str, bool]]] = {}
    for r in named(rows):
        key = EmbKey(r["ns"], r["thread_id"], r["msg_id"])
        if key in wanted:
            out.setdefault(key, []).append((r["content"], bool(r["high_sensitivity"])))
    return out


@dataclass(frozen=True)
class HighTurn:
    agent: str
    thread_id: str
    msg_id: str
    role: str
    ts: datetime
    origin: str
    user_id: str
    content: str  # for the caller to name the shapes found; never returned to a client


def high_turns(ch: Client, namespace: str, *, limit: int, offset: int) -> list[HighTurn]:
    """The namespace's live turns that read as high (recorded and saved-only), newest first."""
    rows = ch.query(
        "SELECT toString(agent) AS agent, thread_id, msg_id, toString(role) AS role, ts, "
        "toString(origin) AS origin, user_id, content FROM conversations FINAL "
        "WHERE namespace = {ns:String} AND high_sensitivity AND NOT tombstoned "
        "ORDER BY ts DESC, thread_id, msg_id, agent LIMIT {lim:UInt32} OFFSET {off:UInt32}",
        parameters={"ns": namespace, "lim": limit, "off": offset},
    )
    return [HighTurn(**r) for r in named(rows)]
