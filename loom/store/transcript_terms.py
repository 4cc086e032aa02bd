"""SQL of conversation.search's lexical leg: BM25 over the transcript's postings
(``conversation_terms``, clickhouse_schema/016_transcript_terms.sql), and the check of
each candidate against the newest transcript row.

Scoring, as for saved messages (loom.store.bm25), inside ClickHouse:

    score(d) = sum over query terms t in d of
               idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))

N and avgdl are the namespace's (its postings of the empty term: one per document),
df the term's postings in the namespace, all read by the query itself. They count
every document the index still holds, including a turn tombstoned since (until a
removal or a merge takes its postings away): statistics, never answers. The filters
(agent, thread, run, role) narrow the documents ranked, not the statistics.

Hits are ordered as the saved search orders them (:func:`loom.store.bm25.rank_key`):
more distinct query terms held first, then BM25, so a phrase's words deep in a long
turn outrank a short turn holding one of them many times. The query's stop-words are
dropped first (loom.store.bm25.STOP_WORDS), so that rule counts the words a question is
about, not its "what", "did" and "I".

The index only proposes: :func:`verify` reads each candidate's newest transcript row
(live, recorded, not high, and the same text the posting was written from: a
redaction's new text has postings of its own, its old text's postings name a document
that no longer exists).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store import bm25
from loom.store.clickhouse import key_sets
from loom.store.rows import named, scalar
from loom.store.search import Filters

TABLE = "conversation_terms"


def query_terms(ch: Client, query: str) -> list[str]:
    """The terms the lexical leg looks for: tokenised and stemmed as the index is,
    stop-words dropped (kept when nothing else is left)."""
    sql = f"SELECT {bm25.query_terms_sql('{q:String}', stem=True)}"
    return [str(t) for t in scalar(ch, sql, {"q": query, "stop": bm25.stop_words_param()})]


@dataclass(frozen=True)
class LexicalCandidate:
    """A document the postings propose, with its BM25 score (not yet verified)."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    doc: int
    score: float
    matched: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.thread_id, self.msg_id)


def _filters(filters: Filters, params: dict[str, Any]) -> str:
    out = ["1"]
    if filters.thread_id is not None:
        out.append("thread_id = {th:String}")
        params["th"] = filters.thread_id
    if filters.run_id is not None:
        out.append("run_id = {run:String}")
        params["run"] = filters.run_id
    if filters.role is not None:
        out.append("role = {role:String}")
        params["role"] = filters.role
    if filters.agent is not None:
        out.append("agent = {ag:String}")
        params["ag"] = filters.agent
    return " AND ".join(out)


# The postings of the query's terms in the namespaces (each (term, doc) once: its newest
# version), df counted over all of them before the filters apply; joined to the
# namespaces' statistics; summed per document; the best copy of each turn.
_SEARCH = f"""
WITH {bm25.query_terms_sql("{q:String}", stem=True)} AS qterms
SELECT ns, thread_id, msg_id, argMax(ag, score) AS agent, argMax(doc, score) AS best_doc, max(score) AS best,
       argMax(matched, score) AS terms
FROM (
    SELECT p.namespace AS ns, p.doc AS doc, any(p.thread_id) AS thread_id, any(p.msg_id) AS msg_id,
           any(p.agent) AS ag,
           sum(log(1 + (s.n - p.df + 0.5) / (p.df + 0.5)) * p.tf * ({bm25.K1} + 1)
               / (p.tf + {bm25.K1} * (1 - {bm25.B} + {bm25.B} * p.dl / s.avgdl))) AS score,
           groupArray(p.term) AS matched
    FROM (
        SELECT * FROM (
            SELECT namespace, term, doc, argMax(tf, version) AS tf, argMax(doc_len, version) AS dl,
                   toString(any(agent)) AS agent, any(thread_id) AS thread_id, any(msg_id) AS msg_id,
                   toString(argMax(role, version)) AS role, argMax(run_id, version) AS run_id,
                   count() OVER (PARTITION BY namespace, term) AS df
            FROM {TABLE}
            WHERE namespace IN {{ns:Array(String)}} AND has(qterms, term)
            GROUP BY namespace, term, doc
        ) WHERE {{filters}}
    ) AS p
    INNER JOIN (
        SELECT namespace, count() AS n, avg(doc_len) AS avgdl FROM {TABLE}
        WHERE namespace IN {{ns:Array(String)}} AND term = ''
        GROUP BY namespace
    ) AS s ON p.namespace = s.namespace
    GROUP BY p.namespace, p.doc
)
GROUP BY ns, thread_id, msg_id
ORDER BY length(terms) DESC, best DESC, ns, thread_id, msg_id
LIMIT {{n:UInt32}}
"""


def search(
    ch: Client, namespaces: Sequence[str], query: str, filters: Filters, fetch: int
) -> list[LexicalCandidate]:
    """The best `fetch` turns of the namespaces for `query`, best first (module
    docstring), unverified. The query's terms are computed in the same statement
    (:func:`query_terms` shows them): `has(<constant terms>, term)` still reads only the
    terms' ranges of the primary key (checked with EXPLAIN indexes = 1)."""
    if not namespaces:
        return []
    params: dict[str, Any] = {
        "ns": list(namespaces),
        "q": query,
        "stop": bm25.stop_words_param(),
        "n": fetch,
    }
    sql = _SEARCH.replace("{filters}", _filters(filters, params))
    rows = ch.query(sql, parameters=params)
    return [
        LexicalCandidate(
            namespace=str(r["ns"]),
            agent=r["agent"],
            thread_id=r["thread_id"],
            msg_id=r["msg_id"],
            doc=int(r["best_doc"]),
            score=float(r["best"]),
            matched=tuple(r["terms"]),
        )
        for r in named(rows)
        if r["best"] > 0
    ]


@dataclass(frozen=True)
class TurnText:
    """The newest version of a candidate's transcript row, as the lexical leg checks it."""

    doc: int  # the document its current text makes (a posting of another text is stale)
    live: bool
    high: bool
    recorded: bool
    role: str
    run_id: str
    user_id: str
    ts: datetime
    head: str  # the first `chars` characters


TurnKey = tuple[str, str, str, str]  # (namespace, agent, thread_id, msg_id)


def verify(ch: Client, keys: Iterable[TurnKey], chars: int) -> dict[TurnKey, TurnText]:
    """The newest transcript row of each named turn copy, with its first `chars`
    characters."""
    keys = list(keys)
    if not keys:
        return {}
    rows = ch.query(
        "SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, "
        "cityHash64(thread_id, msg_id, agent, content) AS doc, toUInt8(NOT tombstoned) AS live, "
        "toUInt8(high_sensitivity) AS high, toUInt8(origin = 'recorded') AS recorded, "
        "toString(role) AS role_name, run_id, user_id, ts, leftUTF8(content, {n:UInt32}) AS head "
        "FROM conversations FINAL WHERE namespace IN {ns:Array(String)} AND agent IN {ag:Array(String)} "
        "AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters={"n": chars, **key_sets(keys, ns=0, ag=1, th=2, ids=3)},
    )
    wanted = set(keys)
    out: dict[TurnKey, TurnText] = {}
    for r in named(rows):
        key = (r["ns"], r["ag"], r["thread_id"], r["msg_id"])
        if key in wanted:
            out[key] = TurnText(
                doc=int(r["doc"]),
                live=bool(r["live"]),
                high=bool(r["high"]),
                recorded=bool(r["recorded"]),
                role=r["role_name"],
                run_id=r["run_id"],
                user_id=r["user_id"],
                ts=r["ts"],
                head=r["head"],
            )
    return out


def postings_of(ch: Client, namespace: str, keys: Sequence[TurnKey]) -> list[str]:
    """The terms the index holds for the named turn copies (for tests and diagnostics)."""
    rows = ch.query(
        f"SELECT DISTINCT term FROM {TABLE} WHERE namespace = {{ns:String}} AND term != '' "
        "AND (agent, thread_id, msg_id) IN {keys:Array(Tuple(String, String, String))} ORDER BY term",
        parameters={"ns": namespace, "keys": [(k[1], k[2], k[3]) for k in keys]},
    )
    return [r["term"] for r in named(rows)]
