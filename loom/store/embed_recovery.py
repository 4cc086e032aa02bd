"""SQL of the embedding recovery pass (loom.ops.embedding.recovery): the transcript
rows that landed in a window of insert times, in a stable order, and the position the
pass reached (table embed_recovery, migration 008).

The window is on ``created_at``, the server's insert time (the client's ``ts`` may be
anything), which a minmax index (idx_created) lets ClickHouse prune by: a page reads
the parts and granules that hold rows inserted since the position, not the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.keys import EmbKey, TurnKey
from loom.store.rows import VERSION, Column, column, decoded, scalar, table
from loom.store.transcript_postings import SPEAKER_SQL

NAME = "turns"  # the position in insert-time order
SWEEP = "sweep"  # the first pass's position in key order (see landed_in_key_order)


@dataclass(frozen=True, order=True)
class Position:
    """A point in the pass's order: (created_at, namespace, agent, thread_id, msg_id)."""

    created_at: datetime = column("DateTime64(3, 'UTC')")
    namespace: str = column("String", default="")
    agent: str = column("String", default="")
    thread_id: str = column("String", default="")
    msg_id: str = column("String", default="")


# A row of loom.embed_recovery: a named position (NAME or SWEEP) at a version.
TABLE = table("embed_recovery", Position, extra=[Column("name", "String"), VERSION])


@dataclass(frozen=True)
class Landed:
    """A transcript row as the pass reads it (any version: the write re-checks)."""

    position: Position
    role: str
    run_id: str
    user_id: str
    ts: datetime
    text: str  # the first `chars` characters: what an embedding is built from
    high_sensitivity: bool
    is_summary: bool
    tombstoned: bool
    speaker: str = ""  # metadata.speaker (transcript_postings.speaker_of)
    appended_by: str = ""  # the token that appended it (an import's turns: the import's token)

    @property
    def turn_key(self) -> TurnKey:
        p = self.position
        return TurnKey(p.namespace, p.agent, p.thread_id, p.msg_id)

    @property
    def emb_key(self) -> EmbKey:
        p = self.position
        return EmbKey(p.namespace, p.thread_id, p.msg_id)


def horizon(ch: Client, grace_s: float) -> datetime:
    """The server's clock less the grace: the pass looks at rows inserted up to then."""
    at: datetime = scalar(
        ch, "SELECT now64(3, 'UTC') - toIntervalMillisecond({g:UInt64})", {"g": int(grace_s * 1000)}
    )
    return at


def position(ch: Client, name: str = NAME) -> Position | None:
    rows = ch.query(
        "SELECT created_at, namespace, agent, thread_id, msg_id FROM embed_recovery FINAL "
        "WHERE name = {n:String}",
        parameters={"n": name},
    ).named_results()
    return next((Position(**r) for r in rows), None)


def save_position(ch: Client, pos: Position, version: int, name: str = NAME) -> None:
    TABLE.insert(ch, [pos], name=name, version=version)


_SELECT = (
    "SELECT created_at, toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, "
    "toString(role) AS role_name, run_id, user_id, ts, leftUTF8(content, {chars:UInt32}) AS text, "
    f"high_sensitivity, is_summary, tombstoned, {SPEAKER_SQL} AS speaker, appended_by FROM conversations "
)
_EMBEDDED_ROLES = "(role IN ('user', 'assistant') OR is_summary)"


_LANDED_ALIASES = {"namespace": "ns", "agent": "ag", "role": "role_name"}


def _landed(rows: Any) -> list[Landed]:
    return [decoded(Landed, r, _LANDED_ALIASES, position=decoded(Position, r, _LANDED_ALIASES)) for r in rows]


def landed_in_key_order(ch: Client, after: Position, *, limit: int, chars: int) -> list[Landed]:
    """The first pass's page: rows of embedded roles inserted up to `after.created_at`
    (the horizon when the first pass began), after `after`'s key, in key order. With no
    position yet, reading in insert-time order would sort what remains of the whole
    table for every page; in key order each page is a range read that stops at `limit`."""
    rows = ch.query(
        _SELECT + f"WHERE created_at <= {{upto:DateTime64(3, 'UTC')}} AND {_EMBEDDED_ROLES} "
        "AND (namespace, agent, thread_id, msg_id) > ({ns:String}, {ag:String}, {th:String}, {m:String}) "
        "ORDER BY namespace, agent, thread_id, msg_id LIMIT {lim:UInt32}",
        parameters={
            "upto": after.created_at,
            "ns": after.namespace,
            "ag": after.agent,
            "th": after.thread_id,
            "m": after.msg_id,
            "lim": limit,
            "chars": chars,
        },
    ).named_results()
    return _landed(rows)


def landed_after(
    ch: Client,
    after: Position | None,
    upto: datetime,
    *,
    limit: int,
    chars: int,
    namespace: str | None = None,
    appended_by: str | None = None,
) -> list[Landed]:
    """Up to `limit` rows of embedded roles (user, assistant, a compaction's summary)
    inserted after `after` and at or before `upto`, in the pass's order (an import's
    embedding: of one namespace, appended by one token)."""
    where = ["created_at <= {upto:DateTime64(3, 'UTC')}", _EMBEDDED_ROLES]
    params: dict[str, Any] = {"upto": upto, "lim": limit, "chars": chars}
    if namespace is not None:
        where.append("namespace = {only_ns:String}")
        params["only_ns"] = namespace
    if appended_by is not None:
        where.append("appended_by = {by:String}")
        params["by"] = appended_by
    if after is not None:
        # The plain bound is what the minmax index prunes by; the tuple orders the ties.
        where.append("created_at >= {at:DateTime64(3, 'UTC')}")
        where.append(
            "(created_at, toString(namespace), toString(agent), thread_id, msg_id) > "
            "({at:DateTime64(3, 'UTC')}, {ns:String}, {ag:String}, {th:String}, {m:String})"
        )
        params.update(
            at=after.created_at, ns=after.namespace, ag=after.agent, th=after.thread_id, m=after.msg_id
        )
    rows = ch.query(
        _SELECT + f"WHERE {' AND '.join(where)} ORDER BY created_at, namespace, agent, thread_id, msg_id "
        "LIMIT {lim:UInt32}",
        parameters=params,
    ).named_results()
    return _landed(rows)
