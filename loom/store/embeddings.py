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

from loom.read_index import feed
from loom.store.by_key import embedding_columns
from loom.store.clickhouse import insert_settings, key_sets
from loom.store.conversations import RECORDED
from loom.store.keys import EmbKey, EmbRef
from loom.store.rows import INSERTED_AT, KEY_ALIASES, column, decoded, named, scalar, table, table_row
from loom.store.transcript_postings import SPEAKER_SQL


def _vector(vec: Any) -> list[float]:
    if isinstance(vec, np.ndarray):
        vec = vec.astype(np.float32, copy=False).tolist()
    return list(vec) if vec is not None else []


@table_row
class EmbeddingRow:
    """A row of loom.conversation_embeddings (every column but the server's ``created_at``)."""

    namespace: str = column("LowCardinality(String)")
    thread_id: str = column("String")
    msg_id: str = column("String")
    agent: str = column("LowCardinality(String)")
    role: str = column("LowCardinality(String)")
    run_id: str = column("String")
    user_id: str = column("String")
    ts: datetime = column("DateTime64(6, 'UTC')")
    text: str = column("String")
    # float32 vector (numpy array or list); empty when the embed failed
    embedding: Any = column("Array(Float32)", encode=_vector)
    model: str = column("LowCardinality(String)")
    error: str = column("String", default="")
    is_summary: bool = column("Bool", default=False)
    is_saved: bool = column("Bool", default=False)
    saved_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)
    tombstoned: bool = column("Bool", default=False)
    version: int = column("UInt64", default=0)
    # The origin of the transcript copy the row serves (loom.store.conversations.RECORDED
    # or SAVED_ONLY): only recorded rows feed conversation.search's vector tables.
    origin: str = column("LowCardinality(String)", default=RECORDED)

    @property
    def key(self) -> EmbKey:
        return EmbKey(self.namespace, self.thread_id, self.msg_id)

    def row(self) -> list[Any]:
        """The insert values, in :data:`COLUMNS` order."""
        return TABLE.values(self)


TABLE = table("conversation_embeddings", EmbeddingRow, server=[INSERTED_AT])
COLUMNS = TABLE.insert_names
COLUMN_TYPES = TABLE.insert_types


# Left to the merges by small inserts (loom.store.clickhouse.insert_settings): the
# vector tables' HNSW graphs (`ann`, fed by views on this table) and the owner filter.
DEFERRED_INDEXES = ("ann", "idx_user")


def insert(ch: Client, rows: Sequence[EmbeddingRow], *, dedup_token: str = "") -> None:
    settings = insert_settings(ch, len(rows), DEFERRED_INDEXES, dedup_token)
    TABLE.insert(ch, rows, settings=settings)
    feed.embeddings_written(rows)  # durable: the read index may now hold them


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
    found = embedding_columns(
        ch,
        keys,
        "toString(agent) AS ag, text, length(embedding) > 0 AS has_vector, toString(model) AS model_name, "
        "error, tombstoned, version",
    )
    return {
        key: decoded(EmbeddingState, r, {"agent": "ag", "model": "model_name"}) for key, r in found.items()
    }


def live_texts(ch: Client, keys: Iterable[EmbKey]) -> dict[EmbKey, str]:
    """For each named row that holds a live vector (no error, not tombstoned), the text
    the vector was built from: what an append of another agent's copy of the turn reuses."""
    found = embedding_columns(
        ch, keys, "text", " AND length(embedding) > 0 AND error = '' AND NOT tombstoned"
    )
    return {key: r["text"] for key, r in found.items()}


_FULL = f"SELECT {TABLE.read_list} FROM conversation_embeddings FINAL "


def select_rows(*, vectors: bool = True) -> str:
    """The newest-version read of the table; without vectors, each row's `embedding` is
    empty (a point read then skips the widest column, 1.5 KB a row of every granule)."""
    if vectors:
        return _FULL
    return _FULL.replace(", embedding, ", ", emptyArrayFloat32() AS embedding, ", 1)


def rows(ch: Client, keys: Iterable[EmbKey], *, vectors: bool = True) -> dict[EmbKey, EmbeddingRow]:
    """The newest version of each named row, with its vector (or an empty one)."""
    keys = list(keys)
    if not keys:
        return {}
    found = ch.query(
        select_rows(vectors=vectors)
        + "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} "
        "AND msg_id IN {ids:Array(String)}",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    )
    wanted = set(keys)
    out = {}
    for row in TABLE.rows(found):
        if row.key in wanted:
            out[row.key] = row
    return out


def get(
    ch: Client, namespace: str, thread_id: str, msg_id: str, *, vectors: bool = True
) -> EmbeddingRow | None:
    return rows(ch, [EmbKey(namespace, thread_id, msg_id)], vectors=vectors).get(
        EmbKey(namespace, thread_id, msg_id)
    )


def count(ch: Client, namespace: str, thread_id: str | None = None) -> int:
    """How many embedding rows the namespace (or one thread) has, tombstoned included."""
    where = "namespace = {ns:String}"
    params: dict[str, Any] = {"ns": namespace}
    if thread_id is not None:
        where += " AND thread_id = {th:String}"
        params["th"] = thread_id
    return int(scalar(ch, f"SELECT count() FROM conversation_embeddings FINAL WHERE {where}", params))


@dataclass(frozen=True)
class ReembedCandidate(EmbRef):
    text: str
    tombstoned: bool
    version: int


def scan(
    ch: Client, namespace: str, *, after: tuple[str, str] | None, limit: int, thread_id: str | None = None
) -> list[ReembedCandidate]:
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
        "SELECT toString(namespace) AS ns, thread_id, msg_id, text, tombstoned, version FROM conversation_embeddings FINAL "
        f"WHERE {' AND '.join(where)} ORDER BY thread_id, msg_id LIMIT {{lim:UInt32}}",
        parameters=params,
    )
    return [decoded(ReembedCandidate, r, KEY_ALIASES) for r in named(found)]


def speakers(ch: Client, keys: Sequence[EmbKey]) -> dict[EmbKey, tuple[str, bool, str]]:
    """The role and summary flag of each named embedding row's newest version, and the
    speaker's name its live transcript rows give (what the model reads a re-embedded
    text behind, with LOOM_EMBED_SPEAKER_PREFIX on; the re-embed job's payload carries
    only the text)."""
    if not keys:
        return {}
    names = _speaker_names(ch, keys)
    found = embedding_columns(ch, keys, "toString(role) AS role_name, is_summary")
    return {key: (r["role_name"], bool(r["is_summary"]), names.get(key, "")) for key, r in found.items()}


def _speaker_names(ch: Client, keys: Sequence[EmbKey]) -> dict[EmbKey, str]:
    """metadata.speaker of the turns' live transcript rows (the greatest, should two
    agents' copies disagree: an embedding row serves every copy)."""
    rows = ch.query(
        f"SELECT toString(namespace) AS ns, thread_id, msg_id, max({SPEAKER_SQL}) AS speaker "
        "FROM conversations FINAL WHERE namespace IN {ns:Array(String)} "
        "AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)} AND NOT tombstoned "
        "GROUP BY namespace, thread_id, msg_id",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    )
    return {EmbKey(r["ns"], r["thread_id"], r["msg_id"]): r["speaker"] for r in named(rows)}
