"""SQL of conversation.delete: tombstoning one agent's thread (its turns, its thread row)
and settling the thread's shared embedding rows.

The rules that decide what becomes of the thread's shared embedding rows are the op's
(loom.ops.conversation.lifecycle.deleting); this module reads what they need and writes rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.clock import next_version, utcnow
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import threads as thread_store
from loom.store.rows import decoded, scalar

_THREAD_WHERE = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}"


def tombstone_turns(ch: Client, namespace: str, agent: str, thread_id: str, reason: str) -> int:
    """Tombstone every live turn of one agent's thread (a newer version of each, written
    by the engine from the newest one; saved_at stays, so the revision reaches the
    saved-message indexes too). Returns how many."""
    params = {"ns": namespace, "ag": agent, "th": thread_id, "why": reason, "v": next_version()}
    count = int(
        scalar(
            ch, f"SELECT count() FROM conversations FINAL WHERE {_THREAD_WHERE} AND NOT tombstoned", params
        )
    )
    if not count:
        return 0
    replaced = {"tombstoned": "true", "tombstoned_at": "now64(3)", "tombstone_reason": "{why:String}"}
    conv_store.TABLE.revise(ch, replaced, f"{_THREAD_WHERE} AND NOT tombstoned", params)
    return count


def tombstone_thread(ch: Client, namespace: str, agent: str, thread_id: str) -> bool:
    """A tombstoned version of the thread row (a clock version: above every row an
    append writes). False when the thread had no live row."""
    row = thread_store.get(ch, namespace, agent, thread_id)
    if row is None or row.tombstoned:
        return False
    thread_store.insert(ch, [replace(row, tombstoned=True, updated_at=utcnow(), version=next_version())])
    return True


@dataclass(frozen=True)
class Copy:
    """One agent's transcript row of a turn (newest version, tombstoned or not)."""

    agent: str
    msg_id: str
    role: str
    head: str  # the first characters of its content (as many as an embedding row keeps)
    user_id: str
    run_id: str
    is_summary: bool
    is_saved: bool
    saved_at: datetime | None
    high_sensitivity: bool
    tombstoned: bool
    origin: str = conv_store.RECORDED  # how the copy came to exist (recorded, or saved only)
    version: int = 0  # the row's version: a writer that read the turn before can tell it is unchanged


# A copy's columns as copy_of reads them by name (the head needs the {n:UInt32} parameter).
COPY_COLUMNS = (
    "toString(agent) AS agent, msg_id, toString(role) AS role, leftUTF8(content, {n:UInt32}) AS head, user_id, "
    "run_id, is_summary, is_saved, saved_at, high_sensitivity, tombstoned, toString(origin) AS origin, version"
)


def copy_of(r: dict[str, Any]) -> Copy:
    return decoded(Copy, r)


def copies(ch: Client, namespace: str, thread_id: str, chars: int) -> dict[str, dict[str, Copy]]:
    """Every agent's row of every turn of the thread: msg_id -> agent -> copy."""
    rows = ch.query(
        f"SELECT {COPY_COLUMNS} FROM conversations FINAL WHERE namespace = {{ns:String}} AND thread_id = {{th:String}}",
        parameters={"ns": namespace, "th": thread_id, "n": chars},
    ).named_results()
    out: dict[str, dict[str, Copy]] = {}
    for r in rows:
        c = copy_of(r)
        out.setdefault(c.msg_id, {})[c.agent] = c
    return out


def thread_embeddings(
    ch: Client, namespace: str, thread_id: str, *, vectors: bool = True
) -> list[emb_store.EmbeddingRow]:
    """The newest version of every live embedding row of the thread, with its vector
    (or, with ``vectors=False``, an empty one: a writer that only needs the vectors of
    the few rows it hands over reads those with embeddings.rows)."""
    found = ch.query(
        emb_store.select_rows(vectors=vectors) + "WHERE namespace = {ns:String} AND thread_id = {th:String}",
        parameters={"ns": namespace, "th": thread_id},
    )
    return [r for r in emb_store.TABLE.rows(found) if not r.tombstoned]
