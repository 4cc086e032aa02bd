"""SQL of conversation.search's lexical leg: BM25 over the transcript's postings
(``conversation_terms``, clickhouse_schema/016_transcript_terms.sql), and the check of
each candidate against the newest transcript row.

Scoring, as for saved messages (loom.store.bm25), inside ClickHouse:

    score(d) = sum over query terms t in d of
               idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))

N and avgdl are the namespace's (its postings of the empty term: one per document),
df the term's postings in the namespace, read per query by a first statement. They
count every document the index still holds, including a turn tombstoned since (until a
removal or a merge takes its postings away): statistics, never answers. The filters
(agent, thread, run, role) narrow the documents ranked, not the statistics. Terms held
by most of a large namespace are left out of the ranking when the query has rarer
ones (MAX_DF_SHARE).

Hits are ordered as the saved search orders them (:func:`loom.store.bm25.rank_key`):
more distinct query terms held first, then BM25, so a phrase's words deep in a long
turn outrank a short turn holding one of them many times. The query's stop-words are
dropped first (loom.store.bm25.STOP_WORDS), so that rule counts the words a question is
about, not its "what", "did" and "I".

The index only proposes: :func:`verify` reads each candidate's newest transcript row
without its text (live, recorded, not high, and at the version the document's newest
postings were written from: a tombstone, a redaction's new text or a mark as high
writes none for that document). :func:`heads` reads the excerpt from the document's
empty-term posting, a few small granules, rather than the transcript's 8,192-row
granules of text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store import bm25
from loom.store.by_key import turn_columns
from loom.store.keys import TurnKey
from loom.store.rows import KEY_ALIASES, decoded, named, scalar
from loom.store.search import Filters, filter_conditions

TABLE = "conversation_terms"


def query_terms(ch: Client, query: str) -> list[str]:
    """The terms the lexical leg looks for: tokenised and stemmed as the index is,
    stop-words dropped (kept when nothing else is left)."""
    sql = f"SELECT {bm25.query_terms_sql('{q:String}', stem=True)}"
    return [str(t) for t in scalar(ch, sql, {"q": query, "stop": bm25.stop_words_param()})]


@dataclass(frozen=True)
class LexicalCandidate:
    """A turn copy the postings propose, with its BM25 score (not yet verified)."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    doc: int
    version: int  # the newest transcript row version the doc's postings were written from
    score: float
    held: int  # distinct query terms the text holds

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.thread_id, self.msg_id)


def _filters(filters: Filters, params: dict[str, Any]) -> str:
    return "".join(f" AND {c}" for c in filter_conditions(filters, params))


# Terms held by more than this share of a namespace's documents (and by more than
# PRUNE_MIN_DF of them) are left out of the ranking when the query has a rarer term:
# their idf is small (ln(1 + 19) = 3.0 at 5%, against 9.2 for a term in 10 of 100,000),
# and their postings are most of what a query would read (measured on the 100k-turn
# bench set: engine CPU per query 96 ms with every term, 44 ms with this rule). A
# namespace of up to PRUNE_MIN_DF documents is never pruned.
MAX_DF_SHARE = 0.05
PRUNE_MIN_DF = 2_000


@dataclass
class _Corpus:
    """One namespace's statistics for a query: documents, their average length, and
    the document frequency of each query term."""

    n: int = 0
    avgdl: float = 1.0
    df: dict[str, int] = field(default_factory=dict)

    def weights(self) -> dict[str, float]:
        """idf of the terms ranked (see MAX_DF_SHARE)."""
        cap = max(PRUNE_MIN_DF, MAX_DF_SHARE * self.n)
        kept = {t: d for t, d in self.df.items() if d <= cap} or self.df
        return {t: math.log(1 + (self.n - d + 0.5) / (d + 0.5)) for t, d in kept.items()}


# One statement: each namespace's documents (postings of the empty term) and each query
# term's postings, counted (the terms from loom.store.bm25.py_query_terms).
_STATS = f"""
SELECT toString(namespace) AS ns, term, count() AS df, avg(doc_len) AS avgdl FROM {TABLE}
WHERE namespace IN {{ns:Array(String)}} AND term IN {{terms:Array(String)}}
GROUP BY namespace, term
"""


def _corpora(ch: Client, namespaces: Sequence[str], query: str) -> dict[str, _Corpus]:
    terms = bm25.py_query_terms(query, stem=True)
    params = {"ns": list(namespaces), "terms": ["", *terms]}
    out: dict[str, _Corpus] = {}
    for r in named(ch.query(_STATS, parameters=params)):
        c = out.setdefault(r["ns"], _Corpus())
        if r["term"] == "":
            c.n, c.avgdl = int(r["df"]), max(1.0, float(r["avgdl"]))
        else:
            c.df[r["term"]] = int(r["df"])
    return out


# LexicalCandidate's fields by the aliases _SCORE reads them under.
_CANDIDATE_ALIASES = {"namespace": "ns", "thread_id": "th", "msg_id": "mid", "version": "newest"}
# The postings of the ranked terms, each weighed by its namespace's idf, summed per
# document. A (term, document) posting can be there twice until a merge (a revision that
# kept the text); groupUniqArray counts it once.
_SCORE = f"""
SELECT ns, doc, any(thread_id) AS th, any(msg_id) AS mid, any(ag) AS agent, max(version) AS newest,
       arraySum(x -> x.2, groupUniqArray((term, part))) AS score, uniqExact(term) AS held
FROM (
    SELECT toString(namespace) AS ns, term, doc, thread_id, msg_id, toString(agent) AS ag, version,
           transform(concat(ns, '\t', term), {{wk:Array(String)}}, {{wv:Array(Float64)}}, 0.) * tf * ({bm25.K1} + 1)
           / (tf + {bm25.K1} * (1 - {bm25.B} + {bm25.B} * doc_len
                / transform(ns, {{ak:Array(String)}}, {{av:Array(Float64)}}, 1.))) AS part
    FROM {TABLE}
    WHERE namespace IN {{ns:Array(String)}} AND term IN {{terms:Array(String)}}
      AND has({{wk:Array(String)}}, concat(ns, '\t', term)) {{filters}}
)
GROUP BY ns, doc
ORDER BY held DESC, score DESC, ns, doc
LIMIT {{n:UInt32}}
"""


def search(
    ch: Client, namespaces: Sequence[str], query: str, filters: Filters, fetch: int
) -> list[LexicalCandidate]:
    """The best `fetch` turns of the namespaces for `query`, best first (module
    docstring), unverified: one copy per turn (the best of its agents' copies)."""
    if not namespaces:
        return []
    corpora = _corpora(ch, namespaces, query)
    weights = {(ns, t): w for ns, c in corpora.items() for t, w in c.weights().items()}
    if not weights:
        return []
    params: dict[str, Any] = {
        "ns": sorted(corpora),
        "terms": sorted({t for _, t in weights}),
        "wk": [f"{ns}\t{t}" for ns, t in weights],
        "wv": list(weights.values()),
        "ak": list(corpora),
        "av": [c.avgdl for c in corpora.values()],
        "n": fetch,
    }
    sql = _SCORE.replace("{filters}", _filters(filters, params))
    out: dict[tuple[str, str, str], LexicalCandidate] = {}
    for r in named(ch.query(sql, parameters=params)):
        c = decoded(LexicalCandidate, r, _CANDIDATE_ALIASES)
        if c.score > 0 and c.key not in out:  # rows come best first: the turn's best copy
            out[c.key] = c
    return list(out.values())


@dataclass(frozen=True)
class TurnNow:
    """The newest version of a candidate's transcript row, as the lexical leg checks it
    (its text is not read: the version says whether it is still the text indexed)."""

    version: int
    live: bool
    high: bool
    recorded: bool
    role: str
    run_id: str
    user_id: str
    ts: datetime


def verify(ch: Client, keys: Iterable[TurnKey]) -> dict[TurnKey, TurnNow]:
    """The newest transcript row of each named turn copy. A posting is current when
    its document's newest posting version is the row's newest version: postings are
    written for live, recorded, not-high rows only, and a revision that keeps the text
    writes the same postings again with its own version."""
    found = turn_columns(
        ch,
        keys,
        "version, toUInt8(NOT tombstoned) AS live, toUInt8(high_sensitivity) AS high, "
        "toUInt8(origin = 'recorded') AS recorded, toString(role) AS role_name, run_id, user_id, ts",
    )
    return {key: decoded(TurnNow, r, KEY_ALIASES) for key, r in found.items()}


HEAD_CHARS = 2_048  # what a document's empty-term posting keeps of its text (migration 016)


def heads(ch: Client, docs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The first HEAD_CHARS characters of each (namespace, document), from its
    empty-term posting: a few small granules of this table."""
    if not docs:
        return {}
    rows = ch.query(
        f"SELECT toString(namespace) AS ns, doc, any(head) AS text FROM {TABLE} "
        "WHERE namespace IN {ns:Array(String)} AND term = '' AND doc IN {docs:Array(UInt64)} "
        "GROUP BY namespace, doc",
        parameters={"ns": sorted({d[0] for d in docs}), "docs": sorted({d[1] for d in docs})},
    )
    wanted = set(docs)
    return {(r["ns"], int(r["doc"])): r["text"] for r in named(rows) if (r["ns"], int(r["doc"])) in wanted}


def postings_of(ch: Client, namespace: str, keys: Sequence[TurnKey]) -> list[str]:
    """The terms the index holds for the named turn copies (for tests and diagnostics)."""
    rows = ch.query(
        f"SELECT DISTINCT term FROM {TABLE} WHERE namespace = {{ns:String}} AND term != '' "
        "AND (agent, thread_id, msg_id) IN {keys:Array(Tuple(String, String, String))} ORDER BY term",
        parameters={"ns": namespace, "keys": [(k[1], k[2], k[3]) for k in keys]},
    )
    return [r["term"] for r in named(rows)]
