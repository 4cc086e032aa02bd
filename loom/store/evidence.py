"""SQL of loom.memory_evidence: the messages and observations an extraction read, and
memory.recall's reads over them (BM25 from evidence_terms, and time windows).

A row that reads as high keeps no text (content '', high_sensitivity true); reads never
return it. Evidence is keyed by (namespace, user_id, evidence_id), the id derived from
the scope and the message's id, so posting the same message again writes the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.bm25 import query_terms_sql, stop_words_param, terms_sql
from loom.store.memories import BM25_DOCUMENT, LexicalSource, Scope, bm25, rank_scored
from loom.store.rows import column, table, table_row


@table_row
class Evidence:
    """A row of loom.memory_evidence (every column but the server's ``doc`` and ``doc_len``)."""

    namespace: str = column("LowCardinality(String)")
    user_id: str = column("String")
    evidence_id: str = column("String")
    session_id: str = column("String")
    run_id: str = column("String")
    source: str = column("LowCardinality(String)")
    msg_id: str = column("String")
    role: str = column("LowCardinality(String)")
    content: str = column("String")
    high_sensitivity: bool = column("Bool")
    ts: datetime = column("DateTime64(6, 'UTC')")
    created_at: datetime = column("DateTime64(3, 'UTC')")
    tombstoned: bool = column("Bool", default=False)
    version: int = column("UInt64", default=0)


TABLE = table("memory_evidence", Evidence, server=BM25_DOCUMENT)
LEXICAL = LexicalSource(
    spec=TABLE, terms="evidence_terms", id_col="evidence_id", live="NOT tombstoned AND NOT high_sensitivity"
)


def insert(ch: Client, rows: Sequence[Evidence]) -> None:
    if rows:
        TABLE.insert(ch, rows)


def get(ch: Client, namespace: str, user_id: str, ids: Sequence[str]) -> list[Evidence]:
    """The newest live versions of the named rows, oldest message first."""
    if not ids:
        return []
    return TABLE.select(
        ch,
        "WHERE namespace = {ns:String} AND user_id = {u:String} "
        "AND evidence_id IN {ids:Array(String)} AND NOT tombstoned ORDER BY ts, evidence_id",
        {"ns": namespace, "u": user_id, "ids": list(ids)},
    )


@dataclass(frozen=True)
class Window:
    """Evidence by its message time: from `since`, before `until` (either open)."""

    since: datetime | None = None
    until: datetime | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        """The condition (to append with AND) and its parameters."""
        cond, params = "", {}
        if self.since is not None:
            cond += " AND ts >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')"
            params["since"] = int(self.since.timestamp() * 1_000_000)
        if self.until is not None:
            cond += " AND ts < fromUnixTimestamp64Micro({until:Int64}, 'UTC')"
            params["until"] = int(self.until.timestamp() * 1_000_000)
        return cond, params


EVER = Window()


def recent(
    ch: Client,
    scope: Scope,
    *,
    limit: int,
    window: Window = EVER,
    source: str | None = None,
) -> list[Evidence]:
    """The scope's readable evidence in the time window, newest first."""
    cond, params = window.where()
    if source is not None:
        cond += " AND source = {src:String}"
        params["src"] = source
    return TABLE.select(
        ch,
        f"WHERE {scope.where()} AND NOT tombstoned "
        f"AND NOT high_sensitivity {cond} ORDER BY ts DESC, evidence_id LIMIT {{lim:UInt32}}",
        scope.params() | params | {"lim": limit},
    )


# A scope of at most this many readable rows (in the time window) can be searched by one
# read that tokenises their text on the server (scan_search); a larger one by the
# postings (search). 0 turns the one read off.
SCAN_MAX_ROWS = 2000

# BM25 without the postings, for a small scope: each readable row of the scope comes
# back with its length and the query terms its text holds, with their counts (the
# tokeniser evidence_terms is written with, so they equal the postings), and its text
# only when it holds one. N, df and avgdl are then counted here over the rows.
_SCAN = f"""
WITH {query_terms_sql("{q:String}", stem=False)} AS qterms,
     {terms_sql("content")} AS toks
SELECT {TABLE.read_list.replace(", content,", ", if(empty(_terms), '', content) AS _content,")},
       doc_len AS _dl, arrayFilter(t -> has(toks, t), qterms) AS _terms,
       arrayMap(t -> toUInt32(countEqual(toks, t)), _terms) AS _tfs
FROM memory_evidence FINAL
WHERE {{scope}} AND NOT tombstoned AND NOT high_sensitivity {{window}}
LIMIT {{cap:UInt32}}
"""


def scan_search(
    ch: Client,
    scope: Scope,
    query: str,
    *,
    limit: int,
    cap: int,
    window: Window = EVER,
) -> list[tuple[Evidence, float, tuple[str, ...]]] | None:
    """What :func:`search` answers, by one read of the scope's readable rows in the
    window (no postings join), or None when they are more than `cap`."""
    cond, params = window.where()
    result = ch.query(
        _SCAN.replace("{scope}", scope.where()).replace("{window}", cond),
        parameters=scope.params() | params | {"q": query, "stop": stop_words_param(), "cap": cap + 1},
    )
    rows = TABLE.rows_with(result)
    if len(rows) > cap:
        return None
    n = len(rows)
    avgdl = sum(int(own["_dl"]) for _, own in rows) / n if n else 0.0
    pairs = [
        (e.evidence_id, term, int(tf), int(own["_dl"]), n, avgdl)
        for e, own in rows
        for term, tf in zip(own["_terms"], own["_tfs"], strict=True)
    ]
    hits = rank_scored(pairs, {e.evidence_id: e for e, _ in rows}, limit=limit)
    return [(h.row, h.score, h.matched) for h in hits if not h.row.high_sensitivity]


def search(
    ch: Client,
    scope: Scope,
    query: str,
    *,
    limit: int,
    window: Window = EVER,
) -> list[tuple[Evidence, float, tuple[str, ...]]]:
    """BM25 of `query` over the scope's readable evidence in the time window, best first,
    from the postings (one round trip: the rows come with their scores)."""
    cond, params = window.where()
    hits = bm25(ch, scope, query, limit=limit, source=LEXICAL, extra=cond, extra_params=params)
    return [(h.row, h.score, h.matched) for h in hits if not h.row.high_sensitivity]
