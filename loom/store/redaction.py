"""SQL of conversation.delete_message and conversation.redact: reading one turn (any
state), the compaction summaries that list it, its saved-index documents and memory
evidence, writing the record of a removal, and removing a turn's older row versions
from disk.

A removal from disk is one mutation per table (``ALTER TABLE ... DELETE``), as the
erasure worker removes rows: the engine rewrites the parts that hold the rows without
them. A mutation is durable once submitted (it survives a restart and runs to its end);
the op waits for it, bounded (:func:`unfinished`). Each removal names the rows it takes by their key and a version bound below the
version the op just wrote, so the newest version (the tombstone or the redacted text)
stays and a retry names the same rows. The rules (what is removed, what is rewritten)
are the ops' (loom.ops.conversation.lifecycle.message_removal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store import conversations as conv_store
from loom.store import evidence as evidence_store
from loom.store.rows import column, named, scalar, table_row
from loom.store.rows import table as declare_table

_TURN = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}"


def _turns(ch: Client, where: str, params: dict[str, Any]) -> list[conv_store.Turn]:
    return conv_store.newest(ch, f"{_TURN} AND {where}", params)


def turn(ch: Client, namespace: str, agent: str, thread_id: str, msg_id: str) -> conv_store.Turn | None:
    """The newest version of one agent's turn, tombstoned or not, recorded or saved-only."""
    turns_found = _turns(
        ch, "msg_id = {m:String}", {"ns": namespace, "ag": agent, "th": thread_id, "m": msg_id}
    )
    return next(iter(turns_found), None)


def turns(
    ch: Client, namespace: str, agent: str, thread_id: str, msg_ids: Sequence[str]
) -> list[conv_store.Turn]:
    """The newest versions of the named turns of one agent's thread."""
    if not msg_ids:
        return []
    return _turns(
        ch,
        "msg_id IN {ids:Array(String)}",
        {"ns": namespace, "ag": agent, "th": thread_id, "ids": list(msg_ids)},
    )


def summaries_of(
    ch: Client, namespace: str, agent: str, thread_id: str, msg_id: str
) -> list[conv_store.Turn]:
    """The live compaction summaries of the agent's thread whose ``compacted_from``
    lists the turn."""
    return _turns(
        ch,
        "is_summary AND NOT tombstoned "
        "AND has(JSONExtract(metadata, 'compacted_from', 'Array(String)'), {m:String})",
        {"ns": namespace, "ag": agent, "th": thread_id, "m": msg_id},
    )


def saved_docs(ch: Client, namespace: str, agent: str, thread_id: str, msg_id: str, below: int) -> list[int]:
    """The saved-index document ids (what saved_terms' postings name) of the turn's
    versions older than `below`."""
    docs = ch.query(
        "SELECT DISTINCT doc FROM saved_docs WHERE namespace = {ns:String} AND thread_id = {th:String} "
        "AND msg_id = {m:String} AND agent = {ag:String} AND version < {v:UInt64}",
        parameters={"ns": namespace, "ag": agent, "th": thread_id, "m": msg_id, "v": below},
    )
    return [int(d["doc"]) for d in named(docs)]


@dataclass(frozen=True)
class EvidenceCopies:
    """Memory evidence of one message id: the newest version of each row, and the BM25
    document ids (evidence_terms' postings) of every version, by (user_id, evidence_id)."""

    rows: list[evidence_store.Evidence]
    docs: dict[tuple[str, str], list[int]]

    def holding(self, user_id: str, content: str) -> EvidenceCopies:
        """The rows that hold the turn: its owner's, or (for a turn no user owns, or
        evidence filed under another subject) those with the turn's very text."""
        rows = [e for e in self.rows if (user_id and e.user_id == user_id) or e.content == content]
        keys = {(e.user_id, e.evidence_id) for e in rows}
        return EvidenceCopies(rows, {k: v for k, v in self.docs.items() if k in keys})

    def all_docs(self) -> list[int]:
        return sorted({d for docs in self.docs.values() for d in docs})


def evidence_of(ch: Client, namespace: str, msg_id: str) -> EvidenceCopies:
    """The namespace's evidence rows of the message id, any user (two reads)."""
    params = {"ns": namespace, "m": msg_id}
    where = "WHERE namespace = {ns:String} AND msg_id = {m:String}"
    rows = evidence_store.TABLE.select(ch, where, params, final=True)
    if not rows:
        return EvidenceCopies([], {})
    docs = ch.query(
        f"SELECT user_id, evidence_id, groupUniqArray(doc) AS docs FROM memory_evidence {where} "
        "GROUP BY user_id, evidence_id",
        parameters=params,
    )
    return EvidenceCopies(
        rows, {(d["user_id"], d["evidence_id"]): [int(x) for x in d["docs"]] for d in named(docs)}
    )


# -- the record of a removal --------------------------------------------------------

REDACTED = "redacted"
DELETED = "deleted"


@table_row
class Record:
    """A row of loom.message_redactions (no text of the turn)."""

    namespace: str = column("LowCardinality(String)")
    agent: str = column("LowCardinality(String)")
    thread_id: str = column("String")
    msg_id: str = column("String")
    user_id: str = column("String")
    action: str = column("LowCardinality(String)")
    placeholder: str = column("String")
    spans: int = column("UInt32")
    token_id: str = column("String")
    redacted_at: datetime = column("DateTime64(3, 'UTC')")


RECORDS = declare_table("message_redactions", Record)


def record(ch: Client, rec: Record) -> None:
    RECORDS.insert(ch, [rec])


def records_of_user(ch: Client, namespace: str, user_id: str) -> bytes:
    """The user's removal records in one namespace, as NDJSON (erasure.export's
    ``kind: "redaction"`` lines)."""
    return ch.raw_query(
        "SELECT 'redaction' AS kind, toString(namespace) AS namespace, toString(agent) AS agent, thread_id, "
        "msg_id, user_id, toString(action) AS action, placeholder, spans, token_id, redacted_at "
        "FROM message_redactions WHERE namespace = {ns:String} AND user_id = {u:String} "
        "ORDER BY thread_id, msg_id, redacted_at",
        parameters={"ns": namespace, "u": user_id},
        fmt="JSONEachRow",
        settings={"output_format_json_quote_64bit_integers": 0},
    )


# -- removal from disk --------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """Rows of `table` matching `where` (server-side parameters `params`): counted, then
    removed from disk."""

    table: str
    where: str
    params: dict[str, Any]


def _emb_key(namespace: str, thread_id: str, msg_id: str, below: int) -> dict[str, Any]:
    return {"ns": namespace, "th": thread_id, "m": msg_id, "v": below}


_EMB_WHERE = (
    "namespace = {ns:String} AND thread_id = {th:String} AND msg_id = {m:String} AND version < {v:UInt64}"
)
VECTOR_TABLES = ("conversation_vectors_384", "conversation_vectors_1536")


def turn_versions(namespace: str, agent: str, thread_id: str, msg_id: str, below: int) -> list[Removal]:
    """A transcript row's versions older than `below`, and the copies of them the
    saved index and the transcript's postings (conversation_terms) hold."""
    params = {"ns": namespace, "ag": agent, "th": thread_id, "m": msg_id, "v": below}
    copy = (
        "namespace = {ns:String} AND thread_id = {th:String} AND msg_id = {m:String} "
        "AND agent = {ag:String} AND version < {v:UInt64}"
    )
    return [
        Removal("conversations", f"{_TURN} AND msg_id = {{m:String}} AND version < {{v:UInt64}}", params),
        Removal("saved_docs", copy, params),
        Removal("conversation_terms", copy, params),
    ]


def embedding_versions(namespace: str, thread_id: str, msg_id: str, below: int) -> list[Removal]:
    """An embedding row's versions older than `below` and every copy of them: the vector
    tables' and the per-user saved vectors'."""
    params = _emb_key(namespace, thread_id, msg_id, below)
    return [
        Removal(t, _EMB_WHERE, params) for t in ("conversation_embeddings", *VECTOR_TABLES, "saved_vectors")
    ]


def postings(table: str, namespace: str, docs: Sequence[int]) -> list[Removal]:
    """The postings (saved_terms or evidence_terms) of the named documents."""
    if not docs:
        return []
    return [
        Removal(
            table,
            "namespace = {ns:String} AND doc IN {docs:Array(UInt64)}",
            {"ns": namespace, "docs": list(docs)},
        )
    ]


def evidence_versions(namespace: str, rows: Sequence[tuple[str, str, int]]) -> list[Removal]:
    """Evidence rows' versions older than each bound: (user_id, evidence_id, below)."""
    return [
        Removal(
            "memory_evidence",
            "namespace = {ns:String} AND user_id = {u:String} AND evidence_id = {e:String} AND version < {v:UInt64}",
            {"ns": namespace, "u": u, "e": e, "v": v},
        )
        for u, e, v in rows
    ]


def thread_versions(namespace: str, agent: str, thread_id: str, below: int) -> list[Removal]:
    params = {"ns": namespace, "ag": agent, "th": thread_id, "v": below}
    return [Removal("threads", f"{_TURN} AND version < {{v:UInt64}}", params)]


def _renamed(i: int, r: Removal) -> tuple[str, dict[str, Any]]:
    """The removal's condition with its parameters renamed apart (``p<i>_<name>``), so
    several can share one statement."""
    where, params = r.where, {}
    for name, value in r.params.items():
        where = where.replace(f"{{{name}:", f"{{p{i}_{name}:")
        params[f"p{i}_{name}"] = value
    return where, params


def count(ch: Client, removals: Sequence[Removal]) -> dict[str, int]:
    """How many rows each table's removals name (every version), in one read."""
    if not removals:
        return {}
    parts: list[str] = []
    params: dict[str, Any] = {}
    for i, r in enumerate(removals):
        where, own = _renamed(i, r)
        params |= own
        parts.append(f"SELECT {i} AS i, count() AS n FROM {r.table} WHERE {where}")
    out: dict[str, int] = {}
    for row in named(ch.query(" UNION ALL ".join(parts), parameters=params)):
        table = removals[int(row["i"])].table
        out[table] = out.get(table, 0) + int(row["n"])
    return out


def remove(ch: Client, table: str, removals: Sequence[Removal]) -> None:
    """Submit one table's removals as one mutation (the engine rewrites the parts holding
    the rows without them). Not waited for here: a mutation is durable once submitted
    and runs to the end in the engine whoever waits (see :func:`unfinished`)."""
    wheres: list[str] = []
    params: dict[str, Any] = {}
    for i, r in enumerate(removals):
        if r.table == table:
            where, own = _renamed(i, r)
            wheres.append(f"({where})")
            params |= own
    if wheres:
        ch.command(
            f"ALTER TABLE {table} DELETE WHERE {' OR '.join(wheres)}",
            parameters=params,
            settings={"mutations_sync": 0},
        )


def unfinished(ch: Client, tables: Sequence[str]) -> int:
    """Mutations of these tables not yet done (a removal's, or any earlier one queued
    before it: a table's mutations run in order)."""
    return int(
        scalar(
            ch,
            "SELECT count() FROM system.mutations WHERE database = currentDatabase() "
            "AND table IN {t:Array(String)} AND NOT is_done",
            {"t": list(tables)},
        )
    )


__all__ = [
    "DELETED",
    "REDACTED",
    "EvidenceCopies",
    "Record",
    "Removal",
    "count",
    "embedding_versions",
    "evidence_of",
    "evidence_versions",
    "postings",
    "record",
    "records_of_user",
    "remove",
    "unfinished",
    "saved_docs",
    "summaries_of",
    "thread_versions",
    "turn",
    "turn_versions",
    "turns",
]
