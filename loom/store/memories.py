"""SQL of the memory plane: facts (loom.memories), the decisions extractions took
(loom.memory_decisions), and their reads (vector, BM25, listing).

A fact is one row per (namespace, user_id, memory_id), revised by inserting a newer
version; forgetting it inserts a tombstone version. Reads take the newest version
(FINAL) and only live rows. The postings (memory_terms, clickhouse_schema/015_memory.sql)
are fed by a view and only propose candidates: the BM25 query joins them to the scope's
live rows, from which N and avgdl are computed per query; the pairs it answers are
scored here (see :func:`bm25`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.clock import utcnow
from loom.store.bm25 import K1, B, query_terms_sql, stop_words_param
from loom.store.rows import Column, Table, column, named, table, table_row

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # "not given" for valid_from (the row's created_at then)


def aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def live(as_of: datetime | None, now: datetime) -> tuple[str, dict[str, Any]]:
    """The condition (and its params) of the facts a read answers: by default the current
    facts (not forgotten, not superseded, valid now); with `as_of`, the facts valid at
    that time, superseded or not (a superseded fact stopped being valid when its
    successor became valid)."""
    at = as_of or now
    cond = (
        "NOT tombstoned AND valid_from <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
        "AND (valid_until IS NULL OR valid_until > fromUnixTimestamp64Milli({at:Int64}, 'UTC'))"
    )
    if as_of is None:
        cond += " AND superseded_by = ''"
    return cond, {"at": _ms(at)}


def unclosed(now: datetime) -> tuple[str, dict[str, Any]]:
    """The condition of the facts that are current now or may become so without a write:
    not forgotten, not superseded, not closed by `now` (whether a fact's validity has
    started is left to the reader, :meth:`Fact.valid_at`, at its own time)."""
    return (
        "NOT tombstoned AND superseded_by = '' "
        "AND (valid_until IS NULL OR valid_until > fromUnixTimestamp64Milli({at:Int64}, 'UTC'))",
        {"at": _ms(now)},
    )


@dataclass(frozen=True)
class Scope:
    """Whose memory: one user of one namespace, optionally narrowed to a session and/or run."""

    namespace: str
    user_id: str
    session_id: str = ""
    run_id: str = ""
    # A session's scope that also holds the user's durable facts (those set with no
    # session): what a session resumes with (context.pack) knows its user.
    with_user_facts: bool = False

    def where(self, alias: str = "") -> str:
        """The scope's condition (params from :meth:`params`); an empty session or run
        does not narrow."""
        p = f"{alias}." if alias else ""
        parts = [f"{p}namespace = {{ns:String}}", f"{p}user_id = {{u:String}}"]
        if self.session_id and self.with_user_facts:
            parts.append(f"{p}session_id IN ('', {{sess:String}})")
        elif self.session_id:
            parts.append(f"{p}session_id = {{sess:String}}")
        if self.run_id:
            parts.append(f"{p}run_id = {{run:String}}")
        return " AND ".join(parts)

    def admits(self, session_id: str, run_id: str) -> bool:
        """Whether a row of this session and run is in the scope (as :meth:`where` says)."""
        session_ok = (
            not self.session_id
            or session_id == self.session_id
            or (self.with_user_facts and session_id == "")
        )
        return session_ok and (not self.run_id or run_id == self.run_id)

    def params(self) -> dict[str, Any]:
        return {"ns": self.namespace, "u": self.user_id, "sess": self.session_id, "run": self.run_id}


def _vector(vec: Any) -> list[float]:
    if isinstance(vec, np.ndarray):
        vec = vec.astype(np.float32, copy=False).tolist()
    return list(vec) if vec is not None else []


def _floats(value: Any) -> list[float]:
    return [float(x) for x in value]


@table_row
class Fact:
    """A row of loom.memories, as reads return it: the newest version of one fact."""

    namespace: str = column("LowCardinality(String)")
    user_id: str = column("String")
    memory_id: str = column("String")
    session_id: str = column("String")
    run_id: str = column("String")
    kind: str = column("LowCardinality(String)")
    key: str = column("String")
    text: str = column("String")
    source: str = column("LowCardinality(String)")
    evidence_ids: list[str] = column("Array(String)")
    created_at: datetime = column("DateTime64(3, 'UTC')")
    updated_at: datetime = column("DateTime64(3, 'UTC')")
    tombstoned: bool = column("Bool", default=False)
    model: str = column("LowCardinality(String)", default="")
    embedding: list[float] = column("Array(Float32)", default_factory=list, encode=_vector, decode=_floats)
    embed_error: str = column("String", default="")
    # Validity (clickhouse_schema/017): when the fact became true and stopped being true
    # (None: it holds), the facts it replaced and was replaced by, and its chain's first id.
    valid_from: datetime = column("DateTime64(3, 'UTC')", default=EPOCH)
    valid_until: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)
    supersedes: str = column("String", default="")
    superseded_by: str = column("String", default="")
    lineage: str = column("String", default="")
    version: int = column("UInt64", default=0)

    def __post_init__(self) -> None:
        # A fact that supersedes nothing is its own chain; with no time given it became
        # true when it was made.
        if not self.lineage:
            self.lineage = self.memory_id
        # Reads give naive UTC times: validity is compared with aware ones.
        self.created_at, self.updated_at = aware(self.created_at), aware(self.updated_at)
        self.valid_from = aware(self.valid_from)
        self.valid_until = None if self.valid_until is None else aware(self.valid_until)
        if self.valid_from == EPOCH:
            self.valid_from = self.created_at

    def valid_at(self, at: datetime) -> bool:
        return self.valid_from <= at and (self.valid_until is None or self.valid_until > at)


# doc and doc_len: the BM25 document id and length, MATERIALIZED by the server (evidence
# rows have them too).
BM25_DOCUMENT = [Column("doc", "UInt64"), Column("doc_len", "UInt32")]
TABLE = table("memories", Fact, server=BM25_DOCUMENT)
_READ = TABLE.read_list
# Reads that answer a client skip the vector (1.5 KB a fact).
_READ_NO_VECTOR = _READ.replace(", embedding,", ", [] AS embedding,")


def insert(ch: Client, facts: Sequence[Fact]) -> None:
    if not facts:
        return
    TABLE.insert(ch, facts)


def get(
    ch: Client, namespace: str, user_id: str, memory_ids: Sequence[str], *, with_vector: bool = False
) -> dict[str, Fact]:
    """The newest version of each named fact (tombstoned ones included), by id."""
    if not memory_ids:
        return {}
    cols = _READ if with_vector else _READ_NO_VECTOR
    result = ch.query(
        f"SELECT {cols} FROM memories FINAL WHERE namespace = {{ns:String}} AND user_id = {{u:String}} "
        "AND memory_id IN {ids:Array(String)}",
        parameters={"ns": namespace, "u": user_id, "ids": list(memory_ids)},
    )
    return {f.memory_id: f for f in TABLE.rows(result)}


def newest(ch: Client, namespace: str, user_id: str, memory_ids: Sequence[str]) -> dict[str, Fact]:
    """:func:`get` without FINAL: every stored version of the named facts (a primary-key
    read of their granules only), the newest kept here. FINAL made the engine merge the
    user's whole key range: ~25 ms of CPU for 15 ids of a user holding 100k facts."""
    if not memory_ids:
        return {}
    result = ch.query(
        f"SELECT {_READ_NO_VECTOR} FROM memories WHERE namespace = {{ns:String}} AND user_id = {{u:String}} "
        "AND memory_id IN {ids:Array(String)}",
        parameters={"ns": namespace, "u": user_id, "ids": list(memory_ids)},
    )
    out: dict[str, Fact] = {}
    for f in TABLE.rows(result):
        seen = out.get(f.memory_id)
        if seen is None or f.version > seen.version:
            out[f.memory_id] = f
    return out


def page(
    ch: Client,
    scope: Scope,
    *,
    limit: int,
    after: tuple[int, str] | None = None,
    kind: str | None = None,
    as_of: datetime | None = None,
) -> list[Fact]:
    """The scope's current facts (or those valid at `as_of`), most recently updated
    first, after the cursor position (updated_at in ms, memory_id)."""
    valid, vparams = live(as_of, utcnow())
    params = scope.params() | {"lim": limit} | vparams
    cond = scope.where()
    if kind is not None:
        cond += " AND kind = {kind:String}"
        params["kind"] = kind
    if after is not None:
        cond += (
            " AND (toUnixTimestamp64Milli(updated_at) < {ams:Int64} OR "
            "toUnixTimestamp64Milli(updated_at) = {ams:Int64} AND memory_id < {aid:String})"
        )
        params |= {"ams": after[0], "aid": after[1]}
    result = ch.query(
        f"SELECT {_READ_NO_VECTOR} FROM memories FINAL WHERE {cond} AND {valid} "
        "ORDER BY updated_at DESC, memory_id DESC LIMIT {lim:UInt32}",
        parameters=params,
    )
    return TABLE.rows(result)


def heads(ch: Client, namespace: str, user_id: str, keys: Sequence[str]) -> dict[str, Fact]:
    """The newest fact of each key's chain (not forgotten, not superseded; open or
    closed), with its vector (a revision rewrites the whole row), by key."""
    if not keys:
        return {}
    found = TABLE.select(
        ch,
        "WHERE namespace = {ns:String} AND user_id = {u:String} AND key IN {keys:Array(String)} "
        "AND NOT tombstoned AND superseded_by = '' ORDER BY updated_at DESC, memory_id",
        {"ns": namespace, "u": user_id, "keys": list(keys)},
    )
    out: dict[str, Fact] = {}
    for f in found:
        out.setdefault(f.key, f)
    return out


def chains(
    ch: Client, namespace: str, user_id: str, memory_ids: Sequence[str], *, with_vector: bool = False
) -> list[Fact]:
    """Every version of the chains the named facts belong to (forgotten ones included),
    in one read: the facts sharing their lineage."""
    if not memory_ids:
        return []
    cols = _READ if with_vector else _READ_NO_VECTOR
    result = ch.query(
        f"SELECT {cols} FROM memories FINAL WHERE namespace = {{ns:String}} AND user_id = {{u:String}} "
        "AND lineage IN (SELECT lineage FROM memories FINAL WHERE namespace = {ns:String} "
        "AND user_id = {u:String} AND memory_id IN {ids:Array(String)})",
        parameters={"ns": namespace, "u": user_id, "ids": list(memory_ids)},
    )
    return TABLE.rows(result)


# Each leg of a search answers its rows whole (one round trip per leg, no re-read): the
# read list first, in declaration order, then the leg's own columns. The vector is not
# read back; its place holds an empty array under another name (an alias named
# `embedding` would stand for the column inside cosineDistance too).
_READ_RANKED = _READ.replace(", embedding,", ", CAST([], 'Array(Float32)') AS no_embedding,")


# The query vector travels as hex of its float32 bytes: parsing 384 floats from text
# costs the server more than the ranking of a user's facts.
QUERY_VECTOR = "reinterpret(unhex({qv:String}), 'Array(Float32)')"


@dataclass(frozen=True)
class VectorHit:
    memory_id: str
    similarity: float
    fact: Fact


def vector_search(
    ch: Client,
    scope: Scope,
    vector: np.ndarray,
    model: str,
    *,
    limit: int,
    min_similarity: float,
    as_of: datetime | None = None,
) -> list[VectorHit]:
    """Exact cosine ranking over the scope's current (or `as_of`) embedded facts (one
    user's key range), the facts with it."""
    valid, vparams = live(as_of, utcnow())
    params = (
        scope.params()
        | {
            "qv": np.asarray(vector, dtype="<f4").tobytes().hex(),
            "model": model,
            "lim": limit,
        }
        | vparams
    )
    result = ch.query(
        f"SELECT {_READ_RANKED}, 1 - cosineDistance(embedding, {QUERY_VECTOR}) AS _sim FROM memories FINAL "
        f"WHERE {scope.where()} AND {valid} AND model = {{model:String}} AND length(embedding) > 0 "
        "ORDER BY _sim DESC, memory_id LIMIT {lim:UInt32}",
        parameters=params,
    )
    hits = (VectorHit(f.memory_id, float(own["_sim"]), f) for f, own in TABLE.rows_with(result))
    return [h for h in hits if h.similarity >= min_similarity]


@dataclass(frozen=True)
class LexicalHit:
    id: str
    score: float
    matched: tuple[str, ...]
    row: Any = None  # the Fact or Evidence it names


_TERMS_TABLE = {"memories": "memory_terms", "memory_evidence": "evidence_terms"}


def bm25_sql(table: str, id_col: str, live: str) -> str:
    """The whole ranking in SQL (postings joined to the scope's live rows, N, df and
    avgdl by window functions): the reference :func:`bm25` (and loom.store.memory_scan)
    must agree with (tests/memory/test_facts.py). Not on the serving path: it costs
    twice the server time of :func:`bm25`'s one join."""
    terms_table = _TERMS_TABLE[table]
    return f"""
WITH {query_terms_sql("{q:String}", stem=False)} AS qterms
SELECT id, sum(log(1 + (n - df + 0.5) / (df + 0.5)) * tf * ({K1} + 1)
               / (tf + {K1} * (1 - {B} + {B} * dl / avgdl))) AS score, groupArray(term) AS matched
FROM (
    SELECT p.term AS term, p.tf AS tf, d.id AS id, d.doc_len AS dl, d.n AS n, d.avgdl AS avgdl,
           count() OVER (PARTITION BY p.term) AS df
    FROM (
        SELECT term, doc, any(tf) AS tf FROM {terms_table}
        WHERE namespace = {{ns:String}} AND user_id = {{u:String}} AND has(qterms, term)
        GROUP BY term, doc
    ) AS p
    INNER JOIN (
        SELECT doc, {id_col} AS id, doc_len, count() OVER () AS n, avg(doc_len) OVER () AS avgdl
        FROM {table} FINAL WHERE {{scope}} AND {live}
    ) AS d ON p.doc = d.doc
)
GROUP BY id
ORDER BY length(matched) DESC, score DESC, id
LIMIT {{lim:UInt32}}
"""


# One join answers everything BM25 needs: each (query term, live row holding it) pair,
# with the row whole, its length, and N and avgdl of the scope's live rows (windows over
# the row side, computed before the join). df is the number of pairs of a term, so the
# scoring itself (a few hundred pairs at most for a user) is done here in Python. The
# postings are read by their key (namespace, user_id, term); a posting of an older text,
# or of a row forgotten or outside the scope, finds no partner.
_BM25_PAIRS = f"""
WITH {query_terms_sql("{q:String}", stem=False)} AS qterms
SELECT d.*, p.term AS _term, p.tf AS _tf
FROM (
    SELECT term, doc, any(tf) AS tf FROM {{terms}}
    WHERE namespace = {{ns:String}} AND user_id = {{u:String}} AND has(qterms, term)
    GROUP BY term, doc
) AS p
INNER JOIN (
    SELECT {{read}}, doc AS _doc, doc_len AS _dl, count() OVER () AS _n, avg(doc_len) OVER () AS _avgdl
    FROM {{table}} FINAL WHERE {{scope}} AND {{live}}
) AS d ON p.doc = d._doc
"""


def bm25_scores(pairs: Sequence[tuple[str, str, int, int, int, float]]) -> dict[str, tuple[float, list[str]]]:
    """BM25 of each row from its (id, term, tf, dl, n, avgdl) pairs: score and matched
    terms by id. The formula and its order of sums are those of :func:`bm25_sql`."""
    df: dict[str, int] = {}
    for _, term, *_rest in pairs:
        df[term] = df.get(term, 0) + 1
    out: dict[str, tuple[float, list[str]]] = {}
    for row_id, term, tf, dl, n, avgdl in pairs:
        idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
        part = idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avgdl))
        score, matched = out.get(row_id, (0.0, []))
        matched.append(term)
        out[row_id] = (score + part, matched)
    return out


@dataclass(frozen=True, kw_only=True)
class LexicalSource:
    """A table BM25 ranks: its row spec, postings table, id column and live condition
    (memories here; memory_evidence in loom.store.evidence, which imports this module)."""

    spec: Table[Any]
    terms: str
    id_col: str
    live: str
    read: str | None = None  # the columns read, when not the spec's own

    @property
    def table(self) -> str:
        return self.spec.name


def bm25(
    ch: Client,
    scope: Scope,
    query: str,
    *,
    limit: int,
    source: LexicalSource | None = None,
    extra: str = "",
    extra_params: dict[str, Any] | None = None,
    as_of: datetime | None = None,
) -> list[LexicalHit]:
    """BM25's best rows of `source` (by default the facts) for `query`, each with
    its row (newest live version; for facts the current ones, or those valid at
    `as_of`), best first (more query terms held, then score, then id), in one round trip."""
    if source is None:
        valid, vparams = live(as_of, utcnow())
        source = LexicalSource(
            spec=TABLE, terms="memory_terms", id_col="memory_id", live=valid, read=_READ_NO_VECTOR
        )
        extra_params = (extra_params or {}) | vparams
    sql = (
        _BM25_PAIRS.replace("{terms}", source.terms)
        .replace("{read}", source.read or source.spec.read_list)
        .replace("{table}", source.table)
        .replace("{scope}", scope.where())
        .replace("{live}", source.live + extra)
    )
    params = scope.params() | {"q": query, "stop": stop_words_param()} | (extra_params or {})
    rows: dict[str, Any] = {}
    pairs = []
    for row, own in source.spec.rows_with(ch.query(sql, parameters=params)):
        row_id = getattr(row, source.id_col)
        rows[row_id] = row
        pairs.append((row_id, own["_term"], own["_tf"], own["_dl"], own["_n"], own["_avgdl"]))
    return rank_scored(pairs, rows, limit=limit)


def rank_scored(
    pairs: Sequence[tuple[str, str, int, int, int, float]], rows: dict[str, Any], *, limit: int
) -> list[LexicalHit]:
    """The best `limit` rows by their (id, term, tf, dl, n, avgdl) pairs: more query terms
    held first, then score, then id; a row scoring 0 is no hit."""
    scored = bm25_scores(pairs)
    best = sorted(scored.items(), key=lambda kv: (-len(kv[1][1]), -kv[1][0], kv[0]))[:limit]
    return [LexicalHit(i, score, tuple(matched), rows[i]) for i, (score, matched) in best if score > 0]


# -- decisions ----------------------------------------------------------------------------


@table_row
class DecisionRow:
    """A row of loom.memory_decisions: a decision an extraction took (add, update, delete, leave)."""

    namespace: str = column("LowCardinality(String)")
    user_id: str = column("String")
    extraction_id: str = column("String")
    seq: int = column("UInt32")
    action: str = column("LowCardinality(String)")
    memory_id: str = column("String")
    text: str = column("String")
    evidence_ids: list[str] = column("Array(String)")
    created_at: datetime = column("DateTime64(3, 'UTC')")


DECISIONS = table("memory_decisions", DecisionRow)
DECISION_COLUMNS = tuple(DECISIONS.read_names)


def record_decisions(ch: Client, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        DECISIONS.insert(ch, [DecisionRow(**{c: r[c] for c in DECISION_COLUMNS}) for r in rows])


def decisions(ch: Client, namespace: str, user_id: str, extraction_id: str) -> list[dict[str, Any]]:
    found = DECISIONS.select(
        ch,
        "WHERE namespace = {ns:String} AND user_id = {u:String} AND extraction_id = {e:String} ORDER BY seq",
        {"ns": namespace, "u": user_id, "e": extraction_id},
    )
    return [asdict(d) for d in found]


def blank_decisions(ch: Client, namespace: str, user_id: str, memory_ids: Sequence[str]) -> int:
    """Forget the text the decisions recorded for these facts (memory.delete: a forgotten
    fact's history is forgotten too): each such row is written again with no text (the
    table keeps the last row of a key). Answers how many were blanked."""
    if not memory_ids:
        return 0
    found = DECISIONS.select(
        ch,
        "WHERE namespace = {ns:String} AND user_id = {u:String} AND memory_id IN {ids:Array(String)} "
        "AND text != ''",
        {"ns": namespace, "u": user_id, "ids": list(memory_ids)},
    )
    for d in found:
        d.text = ""
    if found:
        DECISIONS.insert(ch, found)
    return len(found)


# -- undoing one write (loom.ops.memory.erasing) --------------------------------------------


def remove_written(
    ch: Client,
    namespace: str,
    user_id: str,
    *,
    facts: Sequence[tuple[str, int]],
    evidence: Sequence[tuple[str, int]],
    extraction_ids: Sequence[str],
    profiles: Sequence[int] = (),
) -> None:
    """Delete exactly the rows one write inserted: fact and evidence versions by (id,
    version), with their postings (first: they are found through the rows), and the
    decisions of its extractions, and the profile versions it built. Versions are unique, so the id and version lists
    name those rows and no other."""
    base = "namespace = {ns:String} AND user_id = {u:String}"
    params: dict[str, Any] = {"ns": namespace, "u": user_id}
    for written, tbl, terms, id_col in (
        (facts, "memories", "memory_terms", "memory_id"),
        (evidence, "memory_evidence", "evidence_terms", "evidence_id"),
    ):
        if not written:
            continue
        p = params | {"ids": [key for key, _ in written], "vs": [version for _, version in written]}
        mine = f"{base} AND {id_col} IN {{ids:Array(String)}} AND version IN {{vs:Array(UInt64)}}"
        docs = [
            r["doc"] for r in named(ch.query(f"SELECT DISTINCT doc FROM {tbl} WHERE {mine}", parameters=p))
        ]
        if docs:
            ch.command(
                f"DELETE FROM {terms} WHERE {base} AND doc IN {{docs:Array(UInt64)}}",
                parameters=p | {"docs": docs},
            )
        ch.command(f"DELETE FROM {tbl} WHERE {mine}", parameters=p)
    if extraction_ids:
        ch.command(
            f"DELETE FROM memory_decisions WHERE {base} AND extraction_id IN {{xs:Array(String)}}",
            parameters=params | {"xs": list(extraction_ids)},
        )
    if profiles:
        ch.command(
            f"DELETE FROM memory_profiles WHERE {base} AND version IN {{pvs:Array(UInt64)}}",
            parameters=params | {"pvs": list(profiles)},
        )
