"""Reads of the newest version of rows named by their keys.

A read by many keys filters each key column with an IN list (what the primary key
narrows the read with); the lists also match keys not named (their cross product), so
the rows are kept by their whole key here, once, for every such read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import key_sets
from loom.store.keys import EmbKey, TurnKey
from loom.store.rows import named


def embedding_columns(
    ch: Client, keys: Iterable[EmbKey], columns: str, condition: str = ""
) -> dict[EmbKey, dict[str, Any]]:
    """`columns` (SQL, after ``ns, thread_id, msg_id``) of the newest version of each
    named row of loom.conversation_embeddings, by name, for the rows `condition` (SQL,
    `` AND ...``) keeps."""
    keys = list(keys)
    if not keys:
        return {}
    found = ch.query(
        f"SELECT toString(namespace) AS ns, thread_id, msg_id, {columns} FROM conversation_embeddings FINAL "
        "WHERE namespace IN {ns:Array(String)} AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}"
        f"{condition}",
        parameters=key_sets(keys, ns=0, th=1, ids=2),
    )
    wanted = set(keys)
    by_key = ((EmbKey(r["ns"], r["thread_id"], r["msg_id"]), r) for r in named(found))
    return {key: r for key, r in by_key if key in wanted}


def turn_columns(
    ch: Client, keys: Iterable[TurnKey], columns: str, parameters: dict[str, Any] | None = None
) -> dict[TurnKey, dict[str, Any]]:
    """`columns` (SQL, after ``ns, ag, thread_id, msg_id``; `parameters`: theirs) of the
    newest version of each named turn copy of loom.conversations, by name."""
    keys = list(keys)
    if not keys:
        return {}
    found = ch.query(
        f"SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, {columns} "
        "FROM conversations FINAL WHERE namespace IN {ns:Array(String)} AND agent IN {ag:Array(String)} "
        "AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters={**(parameters or {}), **key_sets(keys, ns=0, ag=1, th=2, ids=3)},
    )
    wanted = set(keys)
    by_key = ((TurnKey(r["ns"], r["ag"], r["thread_id"], r["msg_id"]), r) for r in named(found))
    return {key: r for key, r in by_key if key in wanted}
