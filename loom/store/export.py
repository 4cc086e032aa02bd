"""SQL of erasure.export: one user's rows, formatted as NDJSON by ClickHouse
(JSONEachRow), a page at a time in key order: transcript rows, briefs, the memory
plane's facts, evidence and extraction decisions, and the records of the user's turns
that were redacted or removed one by one (placeholder, when, by which token; never the
removed text)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store import redaction
from loom.store.rows import scalar

_TURN_COLUMNS = (
    "'turn' AS kind, toString(namespace) AS namespace, toString(agent) AS agent, thread_id, msg_id, "
    "ts, toString(role) AS role, content, reasoning, user_id, run_id, metadata, tokens, "
    "high_sensitivity, is_summary, is_saved, saved_at, tombstoned, tombstoned_at, "
    "toString(tombstone_reason) AS tombstone_reason"
)


@dataclass(frozen=True)
class Page:
    body: bytes  # NDJSON lines
    rows: int
    last: tuple[Any, ...] | None  # the key of the last row ((agent, thread_id, msg_id) for turns)


def turns_page(
    ch: Client,
    namespace: str,
    user_id: str,
    after: tuple[str, str, str] | None,
    limit: int,
    include_tombstoned: bool,
) -> Page:
    """The user's transcript rows (newest version of each; any version owned by the user
    names a candidate, the newest must be the user's), after `after` in key order."""
    params: dict[str, Any] = {"ns": namespace, "u": user_id, "lim": limit}
    cursor = ""
    if after is not None:
        cursor = " AND (agent, thread_id, msg_id) > ({a:String}, {t:String}, {m:String})"
        params["a"], params["t"], params["m"] = after
    live = "" if include_tombstoned else " AND NOT tombstoned"
    body = ch.raw_query(
        f"SELECT {_TURN_COLUMNS} FROM conversations FINAL WHERE namespace = {{ns:String}}{cursor} "
        "AND (agent, thread_id, msg_id) IN (SELECT agent, thread_id, msg_id FROM conversations "
        f"WHERE namespace = {{ns:String}} AND user_id = {{u:String}}{cursor}) AND user_id = {{u:String}}{live} "
        "ORDER BY agent, thread_id, msg_id LIMIT {lim:UInt32}",
        parameters=params,
        fmt="JSONEachRow",
        settings={"output_format_json_quote_64bit_integers": 0},
    )
    if not body:
        return Page(b"", 0, None)
    rows = body.count(b"\n")
    last_line = body.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    last = json.loads(last_line)
    return Page(body, rows, (last["agent"], last["thread_id"], last["msg_id"]))


_OWNER = "(user_id = {u:String} OR startsWith(brief_key, {p:String}))"


def briefs(
    ch: Client, namespace: str, user_id: str, kind: str, include_tombstoned: bool
) -> tuple[bytes, int]:
    """The user's briefs (their newest state) or the revisions of them, as NDJSON."""
    params = {"ns": namespace, "u": user_id, "p": f"~{user_id}~"}
    mine = f"namespace = {{ns:String}} AND {_OWNER}"
    if kind == "brief":
        live = "" if include_tombstoned else " AND NOT deleted"
        sql = (
            "SELECT 'brief' AS kind, toString(namespace) AS namespace, brief_key, project, branch, session_id, "
            "user_id, toString(agent) AS agent, revision, sections, toString(author) AS author, last_summary, "
            f"created_at, updated_at, deleted FROM session_briefs FINAL WHERE {mine}{live} ORDER BY brief_key"
        )
    else:
        sql = (
            "SELECT 'brief_revision' AS kind, toString(namespace) AS namespace, brief_key, revision, project, "
            "branch, session_id, user_id, toString(agent) AS agent, sections, toString(author) AS author, "
            "event_cursor, last_summary, created_at FROM session_brief_revisions FINAL "
            f"WHERE namespace = {{ns:String}} AND ({_OWNER} OR brief_key IN (SELECT brief_key FROM session_briefs "
            f"WHERE {mine})) ORDER BY brief_key, revision"
        )
    body = ch.raw_query(
        sql, parameters=params, fmt="JSONEachRow", settings={"output_format_json_quote_64bit_integers": 0}
    )
    return body, body.count(b"\n")


def count_turns(ch: Client, namespace: str, user_id: str, include_tombstoned: bool) -> int:
    """How many transcript rows an export of the user will hold (for a progress bar)."""
    live = "" if include_tombstoned else " AND NOT tombstoned"
    return int(
        scalar(
            ch,
            "SELECT count() FROM conversations FINAL WHERE namespace = {ns:String} AND (agent, thread_id, msg_id) IN ("
            "SELECT agent, thread_id, msg_id FROM conversations WHERE namespace = {ns:String} AND user_id = {u:String}) "
            f"AND user_id = {{u:String}}{live}",
            {"ns": namespace, "u": user_id},
        )
    )


# The memory plane's rows: (line kind, table, key columns with their types, columns). A
# fact's own `kind` is exported as `fact_kind` (the line's `kind` names what the line
# is). Vectors are never exported, as embedding rows are not.
_MEMORY_KINDS: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = (
    (
        "memory",
        "memories",
        (("memory_id", "String"),),
        "toString(namespace) AS namespace, user_id, memory_id, session_id, run_id, "
        "toString(kind) AS fact_kind, key, text, toString(source) AS source, evidence_ids, created_at, "
        "updated_at, tombstoned, toString(model) AS model, embed_error, valid_from, valid_until, "
        "supersedes, superseded_by",
    ),
    (
        "memory_evidence",
        "memory_evidence",
        (("evidence_id", "String"),),
        "toString(namespace) AS namespace, user_id, evidence_id, session_id, run_id, "
        "toString(source) AS source, msg_id, toString(role) AS role, content, high_sensitivity, ts, "
        "created_at, tombstoned",
    ),
    (
        "memory_decision",
        "memory_decisions",
        (("extraction_id", "String"), ("seq", "UInt32")),
        "toString(namespace) AS namespace, user_id, extraction_id, seq, toString(action) AS action, "
        "memory_id, text, evidence_ids, created_at",
    ),
)
MEMORY_KINDS = tuple(k[0] for k in _MEMORY_KINDS)


def memory_page(
    ch: Client,
    kind: str,
    namespace: str,
    user_id: str,
    after: tuple[Any, ...] | None,
    limit: int,
    include_tombstoned: bool,
) -> Page:
    """One page of the user's rows of one memory table (the newest version of each; a
    decision is never revised) after the key `after`, in key order."""
    line_kind, tbl, key, cols = next(k for k in _MEMORY_KINDS if k[0] == kind)
    params: dict[str, Any] = {"ns": namespace, "u": user_id, "lim": limit}
    cursor = ""
    if after is not None:
        names = ", ".join(c for c, _ in key)
        values = ", ".join(f"{{k{i}:{t}}}" for i, (_, t) in enumerate(key))
        cursor = f" AND ({names},) > ({values},)"
        params |= {f"k{i}": v for i, v in enumerate(after)}
    live = "" if include_tombstoned or tbl == "memory_decisions" else " AND NOT tombstoned"
    body = ch.raw_query(
        f"SELECT '{line_kind}' AS kind, {cols} FROM {tbl} FINAL "
        f"WHERE namespace = {{ns:String}} AND user_id = {{u:String}}{cursor}{live} "
        f"ORDER BY {', '.join(c for c, _ in key)} LIMIT {{lim:UInt32}}",
        parameters=params,
        fmt="JSONEachRow",
        settings={"output_format_json_quote_64bit_integers": 0},
    )
    if not body:
        return Page(b"", 0, None)
    last = json.loads(body.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    return Page(body, body.count(b"\n"), tuple(last[c] for c, _ in key))


def memory_rows(
    ch: Client, namespace: str, user_id: str, include_tombstoned: bool, page_rows: int
) -> Iterator[tuple[bytes, int]]:
    """The user's facts, evidence and decisions in one namespace, a page at a time."""
    for kind in MEMORY_KINDS:
        after: tuple[Any, ...] | None = None
        while True:
            page = memory_page(ch, kind, namespace, user_id, after, page_rows, include_tombstoned)
            if page.rows:
                yield page.body, page.rows
            if page.rows < page_rows or page.last is None:
                break
            after = page.last


def user_rows(
    ch: Client, user_id: str, namespaces: list[str], include_tombstoned: bool, page_rows: int
) -> Iterator[tuple[bytes, int]]:
    """The export's rows as NDJSON chunks with their row counts (no header or trailer):
    each namespace's transcript rows a page at a time, then its briefs and revisions."""
    for ns in namespaces:
        after: tuple[str, str, str] | None = None
        while True:
            page = turns_page(ch, ns, user_id, after, page_rows, include_tombstoned)
            if page.rows:
                yield page.body, page.rows
            if page.rows < page_rows or page.last is None:
                break
            after = page.last
        for kind in ("brief", "brief_revision"):
            body, n = briefs(ch, ns, user_id, kind, include_tombstoned)
            if n:
                yield body, n
        yield from memory_rows(ch, ns, user_id, include_tombstoned, page_rows)
        body = redaction.records_of_user(ch, ns, user_id)
        if body:
            yield body, body.count(b"\n")
