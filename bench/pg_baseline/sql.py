"""The baseline's schema and SQL (one place, shared by the API app and the harness's direct calls),
and a binary adapter so numpy vectors travel as pgvector's binary format (no float-to-text)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from psycopg import AsyncConnection, Connection
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo

DIM = 384
RRF_K = 60
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64

# One table, as a Postgres-backed memory store would have it. The full-text column is only
# computed for saved messages (the only rows the lexical leg searches), so unsaved turns pay
# nothing for it; the GIN index is partial to match.
CREATE_TABLE = f"""
CREATE TABLE turns (
    namespace  text        NOT NULL,
    thread_id  text        NOT NULL,
    msg_id     text        NOT NULL,
    role       text        NOT NULL,
    user_id    text,
    ts         timestamptz NOT NULL DEFAULT now(),
    content    text        NOT NULL,
    embedding  vector({DIM}),
    saved_at   timestamptz,
    tsv        tsvector GENERATED ALWAYS AS
               (CASE WHEN saved_at IS NOT NULL THEN to_tsvector('english', content) END) STORED
)
"""

# Vectors stay inline in the heap row (pgvector's advice for scans that read many vectors):
# by default a row with a long content would push its 1.5 kB vector out to TOAST, and the
# exact per-user scan of saved messages would fetch every one of them through the TOAST index.
SET_VECTOR_STORAGE = "ALTER TABLE turns ALTER COLUMN embedding SET STORAGE PLAIN"

# Built after a bulk load (faster than maintaining them row by row), before any measurement.
CREATE_INDEXES = [
    "ALTER TABLE turns ADD CONSTRAINT turns_key UNIQUE (namespace, thread_id, msg_id)",
    "CREATE INDEX turns_user ON turns (namespace, user_id)",
    "CREATE INDEX turns_saved ON turns (namespace, user_id) WHERE saved_at IS NOT NULL",
    "CREATE INDEX turns_tsv ON turns USING gin (tsv) WHERE saved_at IS NOT NULL",
    f"CREATE INDEX turns_hnsw ON turns USING hnsw (embedding vector_cosine_ops) "
    f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})",
]

COPY_COLUMNS = (
    "namespace",
    "thread_id",
    "msg_id",
    "role",
    "user_id",
    "ts",
    "content",
    "embedding",
    "saved_at",
)
COPY_SQL = f"COPY turns ({', '.join(COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"

EXISTS = "SELECT 1 FROM turns WHERE namespace = %s AND thread_id = %s AND msg_id = %s"

APPEND = """
INSERT INTO turns (namespace, thread_id, msg_id, role, user_id, ts, content, embedding)
VALUES (%(namespace)s, %(thread_id)s, %(msg_id)s, %(role)s, %(user_id)s, coalesce(%(ts)s::timestamptz, now()),
        %(content)s, %(embedding)b)
ON CONFLICT (namespace, thread_id, msg_id) DO NOTHING
"""

# Vector search: HNSW order-by with the namespace filter, then the cosine floor on the k found.
SEARCH = """
SELECT thread_id, msg_id, 1 - d AS score FROM (
    SELECT thread_id, msg_id, embedding <=> %(q)b AS d
    FROM turns
    WHERE namespace = %(ns)s AND embedding IS NOT NULL
    ORDER BY embedding <=> %(q)b
    LIMIT %(k)s
) hits
WHERE d <= %(max_d)s
ORDER BY d
"""

# Saved-message hybrid search for one user: an exact vector leg over the user's saved rows
# ("+ 0" keeps the planner off the table-wide HNSW index, which would post-filter a small
# per-user set badly) and a full-text leg ranked by ts_rank, fused by reciprocal rank. The
# full-text leg is Postgres's usual websearch_to_tsquery (all terms must match): matching any
# term instead was measured both slower (ts_rank over most of the user's rows) and worse
# (hit@10 0.56 vs 0.71; ts_rank has no IDF, so common words swamp the rare ones).
SAVED_SEARCH = f"""
WITH v AS (
    SELECT thread_id, msg_id, row_number() OVER (ORDER BY d) AS r FROM (
        SELECT thread_id, msg_id, (embedding <=> %(q)b) + 0 AS d
        FROM turns
        WHERE namespace = %(ns)s AND user_id = %(u)s AND saved_at IS NOT NULL AND embedding IS NOT NULL
        ORDER BY d
        LIMIT %(n)s
    ) x
), l AS (
    SELECT thread_id, msg_id, row_number() OVER (ORDER BY rank DESC) AS r FROM (
        SELECT thread_id, msg_id, ts_rank(tsv, query) AS rank
        FROM turns, websearch_to_tsquery('english', %(text)s) AS query
        WHERE namespace = %(ns)s AND user_id = %(u)s AND saved_at IS NOT NULL AND tsv @@ query
        ORDER BY rank DESC
        LIMIT %(n)s
    ) y
)
SELECT coalesce(v.thread_id, l.thread_id) AS thread_id, coalesce(v.msg_id, l.msg_id) AS msg_id,
       coalesce(1.0 / ({RRF_K} + v.r), 0) + coalesce(1.0 / ({RRF_K} + l.r), 0) AS score
FROM v FULL OUTER JOIN l ON v.thread_id = l.thread_id AND v.msg_id = l.msg_id
ORDER BY score DESC
LIMIT %(k)s
"""

ERASE_USER = "DELETE FROM turns WHERE namespace = %s AND user_id = %s"


# -- pgvector binary adapter -----------------------------------------------------------------


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        a = np.asarray(obj, dtype=">f4").ravel()
        return struct.pack(">HH", a.shape[0], 0) + a.tobytes()


class _VectorLoader(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> np.ndarray:
        dim = struct.unpack_from(">H", data)[0]
        return np.frombuffer(bytes(data), dtype=">f4", count=dim, offset=4).astype(np.float32)


def _register(conn: Connection[Any] | AsyncConnection[Any], info: TypeInfo) -> None:
    info.register(conn)
    dumper = type("VectorDumper", (_VectorDumper,), {"oid": info.oid})
    conn.adapters.register_dumper(np.ndarray, dumper)
    conn.adapters.register_loader(info.oid, _VectorLoader)


def register_vector(conn: Connection[Any]) -> None:
    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise RuntimeError("the vector type is missing: CREATE EXTENSION vector first")
    _register(conn, info)


async def register_vector_async(conn: AsyncConnection[Any]) -> None:
    info = await TypeInfo.fetch(conn, "vector")
    if info is None:
        raise RuntimeError("the vector type is missing: CREATE EXTENSION vector first")
    _register(conn, info)
