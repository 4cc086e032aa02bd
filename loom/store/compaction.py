"""SQL of conversation.compact: reading one agent's thread whole (the window is chosen
from it), and, under the thread lease, what the retirement needs in one statement (the
retirement writes the summary and the replaced turns' tombstoned versions through
loom.store.conversations.insert).

The rules (which turns a summary replaces, how shared embedding rows are settled) are
the op's (loom.ops.conversation.lifecycle.compacting).
"""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store.deletion import Copy, copy_of
from loom.store.rows import decoded

_THREAD_WHERE = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}"


def live_turns(ch: Client, namespace: str, agent: str, thread_id: str) -> list[conv_store.Turn]:
    """The thread's live recorded turns, oldest first ((ts, msg_id) order)."""
    return conv_store.newest(
        ch,
        f"{_THREAD_WHERE} AND NOT tombstoned AND {conv_store.IS_RECORDED}",
        {"ns": namespace, "ag": agent, "th": thread_id},
    )


@dataclass
class ThreadNow:
    """The thread as the retirement reads it under the lease: every agent's row of every
    turn (msg_id -> agent -> copy, newest version, with that version), and the live
    embedding rows, without their vectors."""

    copies: dict[str, dict[str, Copy]]
    rows: list[emb_store.EmbeddingRow]


# One statement, two tables (each statement costs the embedded engine a few ms of CPU
# whatever it reads): the rows of both in one shape, told apart by `kind`. A turn's
# `text` is its head (the first {n} characters, what an embedding row keeps); an
# embedding row's high_sensitivity is a placeholder (the column is the turns').
_NOW = (
    "SELECT 'turn' AS kind, toString(agent) AS agent, msg_id, toString(role) AS role, "
    "leftUTF8(content, {n:UInt32}) AS text, user_id, run_id, is_summary, is_saved, saved_at, high_sensitivity, "
    "tombstoned, toString(origin) AS origin, version, ts, '' AS model, '' AS error "
    "FROM conversations FINAL WHERE namespace = {ns:String} AND thread_id = {th:String} "
    "UNION ALL "
    "SELECT 'embedding' AS kind, toString(agent) AS agent, msg_id, toString(role) AS role, text, user_id, run_id, "
    "is_summary, is_saved, saved_at, false AS high_sensitivity, tombstoned, toString(origin) AS origin, version, "
    "ts, toString(model) AS model, error "
    "FROM conversation_embeddings FINAL WHERE namespace = {ns:String} AND thread_id = {th:String}"
)


def thread_now(ch: Client, namespace: str, thread_id: str, chars: int) -> ThreadNow:
    """Every agent's copy of every turn of the thread (as loom.store.deletion.copies reads
    them) and its live embedding rows without vectors (as deletion.thread_embeddings with
    ``vectors=False``), in one statement."""
    found = ch.query(_NOW, parameters={"ns": namespace, "th": thread_id, "n": chars}).named_results()
    out = ThreadNow({}, [])
    for r in found:
        if r["kind"] == "turn":
            c = copy_of({**r, "head": r["text"]})
            out.copies.setdefault(c.msg_id, {})[c.agent] = c
        elif not r["tombstoned"]:  # after FINAL: the newest version of the row decides
            out.rows.append(
                decoded(
                    emb_store.EmbeddingRow,
                    r,
                    namespace=namespace,
                    thread_id=thread_id,
                    embedding=[],
                    tombstoned=False,
                )
            )
    return out
