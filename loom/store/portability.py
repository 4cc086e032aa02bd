"""SQL of import and export (loom.ops.portability): the import jobs (table import_jobs,
migration 023), which rows an import batch finds already there, and an export's pages.

An export reads each kind of row a page at a time in key order (the newest version of
each row, tombstoned ones included: they are shown as such), so its memory stays
bounded whatever the namespace's size. The columns it reads are the lines' fields
(loom.models.portability), named as the lines name them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.clickhouse import key_sets
from loom.store.rows import column, named, named_columns, scalar, table, table_row


def _json_list(value: list[dict[str, str]]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json_dict(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _load(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def _load_list(raw: str) -> list[dict[str, str]]:
    got = _load(raw)
    return got if isinstance(got, list) else []


@table_row
class Job:
    """A row of loom.import_jobs."""

    namespace: str = column("String")
    job_id: str = column("String")
    source: str = column("String")
    format: str = column("LowCardinality(String)")
    options: dict[str, Any] = column("String", encode=_json_dict, decode=_load)
    token_id: str = column("String")
    state: str = column("LowCardinality(String)")
    next_seq: int = column("UInt32")
    position: str = column("String")
    units: int = column("UInt64")
    counts: dict[str, int] = column("String", encode=_json_dict, decode=_load)
    errors: list[dict[str, str]] = column("String", encode=_json_list, decode=_load_list)
    window_start: datetime = column("DateTime64(3, 'UTC')")
    window_end: datetime = column("DateTime64(3, 'UTC')")
    landed_until: datetime = column("DateTime64(3, 'UTC')")
    started_at: datetime = column("DateTime64(3, 'UTC')")
    updated_at: datetime = column("DateTime64(3, 'UTC')")
    finished_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)
    version: int = column("UInt64", default=0)


JOBS = table("import_jobs", Job)


# One job's row, in either table.
_OF_JOB = "WHERE namespace = {ns:String} AND job_id = {j:String}"


def job(ch: Client, namespace: str, job_id: str) -> Job | None:
    return JOBS.first(ch, _OF_JOB, {"ns": namespace, "j": job_id})


def job_by_id(ch: Client, job_id: str) -> Job | None:
    """A job by its id alone (the id says nothing of its namespace: the op checks it)."""
    return JOBS.first(ch, "WHERE job_id = {j:String}", {"j": job_id})


def jobs(ch: Client, namespaces: Sequence[str], limit: int) -> list[Job]:
    return JOBS.select(
        ch,
        "WHERE namespace IN {ns:Array(String)} ORDER BY started_at DESC LIMIT {lim:UInt32}",
        {"ns": list(namespaces), "lim": limit},
    )


@table_row
class Embedding:
    """A row of loom.import_embeddings: an import's background embedding."""

    namespace: str = column("String")
    job_id: str = column("String")
    state: str = column("LowCardinality(String)")
    position: dict[str, Any] = column("String", encode=_json_dict, decode=_load)
    counts: dict[str, int] = column("String", encode=_json_dict, decode=_load)
    rate: float = column("Float64", default=0.0)
    updated_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    version: int = column("UInt64", default=0)


EMBEDDINGS = table("import_embeddings", Embedding)


def embedding(ch: Client, namespace: str, job_id: str) -> Embedding | None:
    return EMBEDDINGS.first(ch, _OF_JOB, {"ns": namespace, "j": job_id})


def embeddings(ch: Client, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Embedding]:
    if not keys:
        return {}
    rows = EMBEDDINGS.select(
        ch, "WHERE namespace IN {ns:Array(String)} AND job_id IN {j:Array(String)}", key_sets(keys, ns=0, j=1)
    )
    return {(r.namespace, r.job_id): r for r in rows}


def put_embedding(ch: Client, e: Embedding) -> None:
    EMBEDDINGS.insert(ch, [e])


def unfinished_embeddings(ch: Client) -> list[Job]:
    """Jobs with turns to embed whose background embedding is not done (the worker's
    tick resumes them after a crash)."""
    return JOBS.select(
        ch,
        "WHERE JSONExtractInt(counts, 'deferred') > 0 AND (namespace, job_id) NOT IN "
        "(SELECT namespace, job_id FROM import_embeddings FINAL WHERE state = 'done')",
        {},
    )


def put(ch: Client, j: Job) -> None:
    JOBS.insert(ch, [j])


def server_now(ch: Client) -> datetime:
    now: datetime = scalar(ch, "SELECT now64(3, 'UTC')")
    return now


# -- what an import batch finds already there ---------------------------------------------

# kind -> (table, key columns); rows of these kinds are written only when absent (an
# import never overwrites a row the namespace already holds, and a second import of the
# same file writes nothing).
KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "thread": ("threads", ("agent", "thread_id")),
    "redaction": ("message_redactions", ("agent", "thread_id", "msg_id", "redacted_at")),
    "brief": ("session_briefs", ("brief_key",)),
    "brief_revision": ("session_brief_revisions", ("brief_key", "revision")),
    "memory": ("memories", ("user_id", "memory_id")),
    "memory_evidence": ("memory_evidence", ("user_id", "evidence_id")),
    "memory_decision": ("memory_decisions", ("user_id", "extraction_id", "seq")),
}


def present(ch: Client, namespace: str, kind: str, keys: Sequence[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Which of `keys` (in KEYS[kind]'s column order) the namespace holds a row of (any
    version: a forgotten fact is still there)."""
    if not keys:
        return set()
    tbl, cols = KEYS[kind]
    by_col = {c: i for i, c in enumerate(cols)}
    conds: list[str] = []
    params: dict[str, Any] = {"ns": namespace}
    for c, i in by_col.items():
        if c == "redacted_at":
            continue  # narrowed by the others; compared below
        params.update(key_sets(keys, **{f"k_{c}": i}))
        conds.append(f"{c} IN {{k_{c}:Array({_type(c)})}}")
    # Aliased apart from the columns: a ClickHouse alias is visible in WHERE.
    sel = ", ".join(f"{f'toString({c})' if c == 'agent' else c} AS found_{c}" for c in cols)
    found = named(
        ch.query(
            f"SELECT DISTINCT {sel} FROM {tbl} WHERE namespace = {{ns:String}} AND {' AND '.join(conds)}",
            parameters=params,
        )
    )
    wanted = {_norm(k) for k in keys}
    return {k for k in (_norm(tuple(r[f"found_{c}"] for c in cols)) for r in found) if k in wanted}


def _type(col: str) -> str:
    return "UInt32" if col in ("seq", "revision") else "String"


def _norm(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # Times compared at the millisecond the column keeps, naive UTC.
    out = []
    for v in key:
        if isinstance(v, datetime):
            v = v.replace(tzinfo=None, microsecond=v.microsecond // 1000 * 1000)
        out.append(v)
    return tuple(out)


def namespace_row_exists(ch: Client, namespace: str) -> bool:
    return bool(scalar(ch, "SELECT count() FROM namespaces WHERE namespace = {ns:String}", {"ns": namespace}))


# -- export pages -----------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One kind of export line: where its rows are, their key (the page order), the
    columns as (line field, SQL expression), the fields holding JSON text (exported as
    JSON values) and how a user or thread scope narrows it (None: not in that scope)."""

    kind: str
    table: str
    key: tuple[tuple[str, str], ...]  # (column, type)
    columns: tuple[tuple[str, str], ...]
    json_fields: tuple[str, ...] = ()
    final: bool = True
    user_sql: str | None = None
    thread_sql: str | None = None


def _cols(names: str) -> tuple[tuple[str, str], ...]:
    out = []
    for part in names.split(","):
        part = part.strip()
        if " AS " in part:
            expr, name = part.rsplit(" AS ", 1)
            out.append((name.strip(), expr.strip()))
        else:
            out.append((part, part))
    return tuple(out)


_THREAD_OF = "thread_id = {th:String} AND ({ag:String} = '' OR agent = {ag:String})"
# The user's turns: any version owned by the user names a candidate, the newest (FINAL)
# must be the user's (erasure.export's rule).
_USER_TURNS = (
    "(agent, thread_id, msg_id) IN (SELECT agent, thread_id, msg_id FROM conversations "
    "WHERE namespace = {ns:String} AND user_id = {u:String}) AND user_id = {u:String}"
)
_USER_THREADS = (
    "(agent, thread_id) IN (SELECT agent, thread_id FROM conversations "
    "WHERE namespace = {ns:String} AND user_id = {u:String})"
)
_USER_BRIEFS = "(user_id = {u:String} OR startsWith(brief_key, {p:String}))"

KINDS: tuple[Kind, ...] = (
    Kind(
        "thread",
        "threads",
        (("agent", "String"), ("thread_id", "String")),
        _cols(
            "toString(agent) AS agent, thread_id, title, metadata, run_id, created_at, updated_at, tombstoned"
        ),
        json_fields=("metadata",),
        user_sql=_USER_THREADS,
        thread_sql=_THREAD_OF,
    ),
    Kind(
        "turn",
        "conversations",
        (("agent", "String"), ("thread_id", "String"), ("msg_id", "String")),
        _cols(
            "toString(agent) AS agent, thread_id, msg_id, ts, toString(role) AS role, content, reasoning, "
            "user_id, run_id, metadata, tokens, high_sensitivity, is_summary, is_saved, saved_at, "
            "toString(origin) AS origin, tombstoned, tombstoned_at, toString(tombstone_reason) AS tombstone_reason"
        ),
        json_fields=("metadata",),
        user_sql=_USER_TURNS,
        thread_sql=_THREAD_OF,
    ),
    Kind(
        "redaction",
        "message_redactions",
        (
            ("agent", "String"),
            ("thread_id", "String"),
            ("msg_id", "String"),
            ("redacted_at", "DateTime64(3, 'UTC')"),
        ),
        _cols(
            "toString(agent) AS agent, thread_id, msg_id, user_id, toString(action) AS action, placeholder, "
            "spans, token_id, redacted_at"
        ),
        final=False,
        user_sql="user_id = {u:String}",
        thread_sql=_THREAD_OF,
    ),
    Kind(
        "brief",
        "session_briefs",
        (("brief_key", "String"),),
        _cols(
            "brief_key, project, branch, session_id, user_id, toString(agent) AS agent, revision, sections, "
            "toString(author) AS author, last_session_id, last_event_cursor, last_summary, created_at, "
            "updated_at, deleted"
        ),
        json_fields=("sections",),
        user_sql=_USER_BRIEFS,
    ),
    Kind(
        "brief_revision",
        "session_brief_revisions",
        (("brief_key", "String"), ("revision", "UInt32")),
        _cols(
            "brief_key, revision, project, branch, session_id, user_id, toString(agent) AS agent, token_id, "
            "sections, toString(author) AS author, event_cursor, last_summary, created_at"
        ),
        json_fields=("sections",),
        user_sql=f"({_USER_BRIEFS} OR brief_key IN (SELECT brief_key FROM session_briefs "
        f"WHERE namespace = {{ns:String}} AND {_USER_BRIEFS}))",
    ),
    Kind(
        "memory",
        "memories",
        (("user_id", "String"), ("memory_id", "String")),
        _cols(
            "user_id, memory_id, session_id, run_id, toString(kind) AS fact_kind, key, text, "
            "toString(source) AS source, evidence_ids, created_at, updated_at, tombstoned, valid_from, "
            "valid_until, supersedes, superseded_by, lineage"
        ),
        user_sql="user_id = {u:String}",
    ),
    Kind(
        "memory_evidence",
        "memory_evidence",
        (("user_id", "String"), ("evidence_id", "String")),
        _cols(
            "user_id, evidence_id, session_id, run_id, toString(source) AS source, msg_id, toString(role) AS role, "
            "content, high_sensitivity, ts, created_at, tombstoned"
        ),
        user_sql="user_id = {u:String}",
    ),
    Kind(
        "memory_decision",
        "memory_decisions",
        (("user_id", "String"), ("extraction_id", "String"), ("seq", "UInt32")),
        _cols(
            "user_id, extraction_id, seq, toString(action) AS action, memory_id, text, evidence_ids, created_at"
        ),
        final=False,
        user_sql="user_id = {u:String}",
    ),
)
KIND_BY_NAME = {k.kind: k for k in KINDS}


@dataclass(frozen=True)
class Scope:
    namespace: str
    user_id: str | None = None
    thread_id: str | None = None
    agent: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "ns": self.namespace,
            "u": self.user_id or "",
            "p": f"~{self.user_id}~",
            "th": self.thread_id or "",
            "ag": self.agent or "",
        }


def kinds_in(scope: Scope) -> list[Kind]:
    """The kinds an export of `scope` holds: a thread's export holds its rows only."""
    if scope.thread_id is not None:
        return [k for k in KINDS if k.thread_sql is not None]
    if scope.user_id is not None:
        return [k for k in KINDS if k.user_sql is not None]
    return list(KINDS)


def _where(kind: Kind, scope: Scope) -> str:
    where = ["namespace = {ns:String}"]
    if scope.thread_id is not None and kind.thread_sql:
        where.append(kind.thread_sql)
    if scope.user_id is not None and kind.user_sql:
        where.append(kind.user_sql)
    return " AND ".join(where)


def count(ch: Client, kind: Kind, scope: Scope) -> int:
    final = " FINAL" if kind.final else ""
    return int(
        scalar(ch, f"SELECT count() FROM {kind.table}{final} WHERE {_where(kind, scope)}", scope.params())
    )


@dataclass
class Page:
    names: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    last: tuple[Any, ...] | None = None


def page(ch: Client, kind: Kind, scope: Scope, after: tuple[Any, ...] | None, limit: int) -> Page:
    """Up to `limit` rows of `kind` after the key `after`, in key order."""
    params = scope.params() | {"lim": limit}
    where = _where(kind, scope)
    if after is not None:
        names = ", ".join(c for c, _ in kind.key)
        values = ", ".join(f"{{k{i}:{t}}}" for i, (_, t) in enumerate(kind.key))
        where += f" AND ({names},) > ({values},)"
        params |= {f"k{i}": v for i, v in enumerate(after)}
    select = ", ".join(f"{expr} AS {name}" if expr != name else name for name, expr in kind.columns)
    keys = ", ".join(c for c, _ in kind.key)
    key_exprs = ", ".join(f"{c} AS _k{i}" for i, (c, _) in enumerate(kind.key))
    final = " FINAL" if kind.final else ""
    result = ch.query(
        f"SELECT {select}, {key_exprs} FROM {kind.table}{final} WHERE {where} ORDER BY {keys} LIMIT {{lim:UInt32}}",
        parameters=params,
    )
    # Column by column (cheaper than a dict per row on a bulk export), zipped into rows.
    fields = [name for name, _ in kind.columns]
    if not result.row_count:
        return Page(fields)  # an empty result may carry no column names
    by_name = named_columns(result)
    page_rows = list(zip(*(by_name[name] for name in fields), strict=True))
    key_cols = [by_name[f"_k{i}"] for i in range(len(kind.key))]
    last = tuple(col[-1] for col in key_cols) if page_rows else None
    return Page(fields, page_rows, last)


def namespace_settings(ch: Client, namespace: str) -> dict[str, Any] | None:
    """The namespace's own row, or None when it has none (nothing to export)."""
    r = next(
        named(
            ch.query(
                "SELECT conversation_logging_enabled, model_calls_enabled, extraction_policy FROM namespaces FINAL "
                "WHERE namespace = {ns:String}",
                parameters={"ns": namespace},
            )
        ),
        None,
    )
    if r is None:
        return None
    return {
        "conversation_logging_enabled": bool(r["conversation_logging_enabled"]),
        "model_calls_enabled": bool(r["model_calls_enabled"]),
        "extraction_policy": r["extraction_policy"],
    }
