"""SQL for loom.conversation_embeddings: one row per (namespace, thread_id, msg_id),
shared by the agents that logged the same turn, revised by a higher ``version``.

``text`` is what the vector was (or is to be) built from: a turn's first 2,048
characters, or 240 for rows earlier builds wrote. ``error`` non-empty with an empty
vector records a failed embed (fail-open); nothing retries it on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import insert_settings, key_sets
from loom.store.conversations import RECORDED

COLUMNS = ["namespace", "thread_id", "msg_id", "agent", "role", "run_id", "user_id", "ts", "text", "embedding",
           "model", "error", "is_summary", "is_saved", "saved_at", "tombstoned", "version", "origin"]
COLUMN_TYPES = ["LowCardinality(String)", "String", "String", "LowCardinality(String)", "LowCardinality(String)",
                "String", "String", "DateTime64(6, 'UTC')", "String", "Array(Float32)", "LowCardinality(String)",
                "String", "Bool", "Bool", "Nullable(DateTime64(3, 'UTC'))", "Bool", "UInt64", "LowCardinality(String)"]

EmbKey = tuple[str, str, str]  # (namespace, thread_id, msg_id)


@dataclass
class EmbeddingRow:
    namespace: str
    thread_id: str
    msg_id: str
    agent: str
    role: str
    run_id: str
    user_id: str
    ts: datetime
    text: str
    embedding: Any              # float32 vector (numpy array or list); empty when the embed failed
    model: str
    error: str = ""
    is_summary: bool = False
    is_saved: bool = False
    saved_at: datetime | None = None
    tombstoned: bool = False
    version: int = 0
    # The origin of the transcript copy the row serves (loom.store.conversations.RECORDED
    # or SAVED_ONLY): only recorded rows feed conversation.search's vector tables.
    origin: str = RECORDED

    @property
    def key(self) -> EmbKey:
        return (self.namespace, self.thread_id, self.msg_id)

    def row(self) -> list[Any]:
        vec = self.embedding
        if isinstance(vec, np.ndarray):
            vec = vec.astype(np.float32, copy=False).tolist()
        return [self.namespace, self.thread_id, self.msg_id, self.agent, self.role, self.run_id, self.user_id,
                self.ts, self.text, list(vec) if vec is not None else [], self.model, self.error, self.is_summary,
                self.is_saved, self.saved_at, self.tombstoned, self.version, self.origin]


# Left to the merges by small inserts (loom.store.clickhouse.insert_settings): the
# vector tables' HNSW graphs (`ann`, fed by views on this table) and the owner filter.
DEFERRED_INDEXES = ("ann", "idx_user")


def insert(ch: Client, rows: Sequence[EmbeddingRow], *, dedup_token: str = "") -> None:
    settings = insert_settings(ch, len(rows), DEFERRED_INDEXES, dedup_token)
    ch.insert("conversation_embeddings", [r.row() for r in rows], column_names=COLUMNS,
              column_type_names=COLUMN_TYPES, settings=settings)


@dataclass(frozen=True)
class EmbeddingState:
    """An embedding row as it reads now, without its vector."""

    agent: str
    text: str
    has_vector: bool
    model: str
    error: str
    tombstoned: bool
    version: int


def states(ch: Client, keys: Iterable[EmbKey]) -> dict[EmbKey, EmbeddingState]:
    """The newest version of each named embedding row (keys with no row are absent)."""
    keys = list(keys)
    if not keys:
        return {}
    rows = ch.query(
        "SELECT toString(namespace), thread_id, msg_id, toString(agent), text, length(embedding) > 0, "
        "toString(model), error, tombstoned, version FROM conversation_embeddings FINAL "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    ).result_rows
    wanted = set(keys)
    out: dict[EmbKey, EmbeddingState] = {}
    for r in rows:
        key = (r[0], r[1], r[2])
        if key in wanted:
            out[key] = EmbeddingState(r[3], r[4], bool(r[5]), r[6], r[7], bool(r[8]), int(r[9]))
    return out


def live_texts(ch: Client, keys: Iterable[EmbKey]) -> dict[EmbKey, str]:
    """For each named row that holds a live vector (no error, not tombstoned), the text
    the vector was built from: what an append of another agent's copy of the turn reuses."""
    keys = list(keys)
    if not keys:
        return {}
    found = ch.query(
        "SELECT toString(namespace), thread_id, msg_id, text FROM conversation_embeddings FINAL "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)} "
        "AND length(embedding) > 0 AND error = '' AND NOT tombstoned",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    ).result_rows
    wanted = set(keys)
    return {(r[0], r[1], r[2]): r[3] for r in found if (r[0], r[1], r[2]) in wanted}


_FULL = ("SELECT toString(namespace), thread_id, msg_id, toString(agent), toString(role), run_id, user_id, ts, text, "
         "embedding, toString(model), error, is_summary, is_saved, saved_at, tombstoned, version, toString(origin) "
         "FROM conversation_embeddings FINAL ")


def _row(r: Sequence[Any]) -> EmbeddingRow:
    return EmbeddingRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], bool(r[12]),
                        bool(r[13]), r[14], bool(r[15]), int(r[16]), r[17])


def rows(ch: Client, keys: Iterable[EmbKey]) -> dict[EmbKey, EmbeddingRow]:
    """The newest version of each named row, with its vector."""
    keys = list(keys)
    if not keys:
        return {}
    found = ch.query(
        _FULL + "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} "
        "AND msg_id IN {ids:Array(String)}",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    ).result_rows
    wanted = set(keys)
    out = {}
    for r in found:
        row = _row(r)
        if row.key in wanted:
            out[row.key] = row
    return out


def get(ch: Client, namespace: str, thread_id: str, msg_id: str) -> EmbeddingRow | None:
    return rows(ch, [(namespace, thread_id, msg_id)]).get((namespace, thread_id, msg_id))


def count(ch: Client, namespace: str, thread_id: str | None = None) -> int:
    """How many embedding rows the namespace (or one thread) has, tombstoned included."""
    where = "namespace = {ns:String}"
    params: dict[str, Any] = {"ns": namespace}
    if thread_id is not None:
        where += " AND thread_id = {th:String}"
        params["th"] = thread_id
    return int(ch.query(f"SELECT count() FROM conversation_embeddings FINAL WHERE {where}",
                        parameters=params).result_rows[0][0])


@dataclass(frozen=True)
class ReembedCandidate:
    namespace: str
    thread_id: str
    msg_id: str
    text: str
    tombstoned: bool
    version: int

    @property
    def key(self) -> EmbKey:
        return (self.namespace, self.thread_id, self.msg_id)


def scan(ch: Client, namespace: str, *, after: tuple[str, str] | None, limit: int,
         thread_id: str | None = None) -> list[ReembedCandidate]:
    """A page of the namespace's embedding rows in key order (tombstoned included, so
    the caller can count them), after the (thread_id, msg_id) position `after`."""
    where = ["namespace = {ns:String}"]
    params: dict[str, Any] = {"ns": namespace, "lim": limit}
    if thread_id is not None:
        where.append("thread_id = {th:String}")
        params["th"] = thread_id
    if after is not None:
        where.append("(thread_id, msg_id) > ({at:String}, {am:String})")
        params["at"], params["am"] = after
    found = ch.query(
        "SELECT toString(namespace), thread_id, msg_id, text, tombstoned, version FROM conversation_embeddings FINAL "
        f"WHERE {' AND '.join(where)} ORDER BY thread_id, msg_id LIMIT {{lim:UInt32}}",
        parameters=params,
    ).result_rows
    return [ReembedCandidate(r[0], r[1], r[2], r[3], bool(r[4]), int(r[5])) for r in found]
