"""Vectors of a model other than the one each embedding row holds, kept beside it in the
vector tables while a namespace is re-embedded with that model (`loom reembed --model`).

Each vector row names its model (migration 022) and carries the version of the
embedding row whose kept text it embeds, so search verifies a row of either model the
same way: it still matches the newest embedding row's version, or the turn changed
since (a deletion, a redaction, a new text) and the row is dropped. A search compares
its query only with vectors of the query's model, so a namespace half-way through a
re-embed answers from the model it was built with, whole, until the process's embedder
is switched (LOOM_EMBEDDER): then from the new one's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import key_sets
from loom.store.embeddings import EmbeddingRow
from loom.store.keys import EmbKey
from loom.store.rows import named
from loom.store.search import VECTOR_TABLES

_COLUMNS = [
    "namespace",
    "thread_id",
    "msg_id",
    "version",
    "model",
    "agent",
    "role",
    "run_id",
    "user_id",
    "ts",
    "text",
]


def staged_versions(ch: Client, dim: int, model: str, keys: Sequence[EmbKey]) -> dict[EmbKey, int]:
    """The newest version each key's vector of `model` was built from (keys without one
    are absent)."""
    if not keys:
        return {}
    rows = ch.query(
        f"SELECT toString(namespace) AS ns, thread_id, msg_id, max(version) AS v FROM {VECTOR_TABLES[dim]} "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} "
        "AND msg_id IN {ids:Array(String)} AND model = {model:String} GROUP BY ns, thread_id, msg_id",
        parameters={**key_sets(keys, ns=0, th=1, ids=2), "model": model},
    )
    wanted = set(keys)
    return {
        key: int(r["v"]) for r in named(rows) if (key := (r["ns"], r["thread_id"], r["msg_id"])) in wanted
    }


def write(ch: Client, model: str, built: Iterable[tuple[EmbeddingRow, np.ndarray]]) -> int:
    """Insert one vector row of `model` per (embedding row, vector), at the embedding
    row's version; returns how many were written."""
    by_dim: dict[int, list[list[Any]]] = {}
    for row, vector in built:
        values = [row.namespace, row.thread_id, row.msg_id, row.version, model, row.agent, row.role]
        values += [row.run_id, row.user_id, row.ts, row.text, np.asarray(vector, dtype=np.float32).tolist()]
        by_dim.setdefault(len(vector), []).append(values)
    for dim, rows in by_dim.items():
        ch.insert(VECTOR_TABLES[dim], rows, column_names=[*_COLUMNS, "embedding"])
    return sum(len(r) for r in by_dim.values())


def coverage(ch: Client, namespace: str) -> dict[str, int]:
    """Rows per model in the namespace's vector tables (older versions of a turn
    included until merged: a progress figure), '' for rows older than migration 022."""
    out: dict[str, int] = {}
    for table in VECTOR_TABLES.values():
        rows = ch.query(
            f"SELECT toString(model) AS m, uniqExact(thread_id, msg_id) AS n FROM {table} "
            "WHERE namespace = {ns:String} GROUP BY m",
            parameters={"ns": namespace},
        )
        for r in named(rows):
            out[r["m"]] = out.get(r["m"], 0) + int(r["n"])
    return out
