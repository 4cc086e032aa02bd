"""memory.search's large-scope index: a scope above the one-read cap (one user holding
thousands to ~100k facts) ranked in the API process from a compact copy of its facts.

The server-side legs of such a scope cost the engine ~130 ms of CPU (reading 100k
vectors and ranking them exactly) and ~55 ms (BM25: the postings joined to every live
row, FINAL) per search at 100k facts. The copy holds only what the two legs rank by,
none of the rows:

* the facts' unit vectors as one float32 matrix (exact cosine is one matrix-vector
  product), with each fact's model;
* an inverted index of the facts' terms (term -> rows, counts): the user's postings
  (memory_terms) of the documents read, as the server-side BM25 joins them, and each
  fact's BM25 length (the server's doc_len);
* each fact's validity (from, until) as milliseconds, so a search keeps the facts valid
  at its own time, as loom.store.memory_scan.select does;
* the ids, and each id's rank in sorted order (ties are broken by id without Python
  string sorts).

It is read once (the facts not forgotten, not superseded, not closed when read) and
serves any query; both legs rank exactly as the server does (:func:`lexical`,
:func:`vector`). The hits name ids and scores only: the caller reads the few rows it
answers and checks them against the newest versions (loom.ops.memory.large_scope).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.store.bm25 import K1, B, py_query_terms, py_terms
from loom.store.memories import Scope, unclosed
from loom.store.rows import named_columns

_NEVER = np.iinfo(np.int64).max

# What the copy needs of each fact: no row, no text (the terms come from the postings),
# the vector as raw float32 bytes.
_READ = """
SELECT memory_id, doc, doc_len, model,
       toUnixTimestamp64Milli(created_at) AS ca,
       toUnixTimestamp64Milli(valid_from) AS vf,
       ifNull(toUnixTimestamp64Milli(valid_until), {never:Int64}) AS vu,
       reinterpret(embedding, 'String') AS vec
FROM memories FINAL
WHERE {scope} AND {valid}
"""

# The user's postings, a row per term with its documents and counts as raw bytes (no
# Python object per posting). They hold the postings of older texts too: only those of
# a document read above are kept (the server-side BM25 joins them the same way).
_POSTINGS = """
SELECT term, reinterpret(groupArray(doc), 'String') AS docs, reinterpret(groupArray(tf), 'String') AS tfs
FROM (
    SELECT term, doc, any(tf) AS tf FROM memory_terms
    WHERE namespace = {ns:String} AND user_id = {u:String}
    GROUP BY term, doc
)
GROUP BY term
"""


@dataclass(frozen=True)
class ScopeIndex:
    """A scope's facts as the two legs rank them (module docstring)."""

    ids: list[str]
    id_rank: np.ndarray  # int32: each row's position in the ids' sorted order
    lengths: np.ndarray  # float64 BM25 document lengths
    valid_from: np.ndarray  # int64 ms
    valid_until: np.ndarray  # int64 ms (_NEVER: open)
    models: list[str]  # the distinct models; model_of indexes them (-1: no vector)
    model_of: np.ndarray  # int16
    matrix: np.ndarray  # float32 (rows, dim): unit vectors, zeros where there is none
    postings: dict[str, tuple[int, int]]  # term -> its slice of post_rows and post_tfs
    post_rows: np.ndarray  # int32 rows holding a term, grouped by term
    post_tfs: np.ndarray  # float64 the term's count in each

    @property
    def nbytes(self) -> int:
        """About what the copy holds in memory (for a cache's budget)."""
        posted = self.post_rows.nbytes + self.post_tfs.nbytes + 150 * len(self.postings)
        return int(self.matrix.nbytes + posted + len(self.ids) * (90 + 4 + 8 * 3 + 2))

    def live(self, at_ms: int) -> np.ndarray:
        """Which rows are valid at `at_ms` (the read left out the forgotten and superseded)."""
        return (self.valid_from <= at_ms) & (self.valid_until > at_ms)


def read(ch: Client, scope: Scope, *, now: datetime) -> ScopeIndex:
    """The scope's facts not forgotten, not superseded and not closed by `now`, as an index
    (a fact whose validity starts later is kept: :meth:`ScopeIndex.live` decides at each
    search's time). Two reads: the facts, then the user's postings."""
    valid, vparams = unclosed(now)
    result = ch.query(
        _READ.replace("{scope}", scope.where()).replace("{valid}", valid),
        parameters=scope.params() | vparams | {"never": int(_NEVER)},
        column_formats={"vec": "bytes"},
    )
    c = named_columns(result)
    ids, docs, lengths, models = c["memory_id"], c["doc"], c["doc_len"], c["model"]
    created, starts, ends, vecs = c["ca"], c["vf"], c["vu"], c["vec"]
    p = named_columns(
        ch.query(_POSTINGS, parameters=scope.params(), column_formats={"docs": "bytes", "tfs": "bytes"})
    )
    return build(
        ids,
        lengths,
        models,
        created,
        starts,
        ends,
        vecs,
        postings=postings_of(docs, list(zip(p["term"], p["docs"], p["tfs"], strict=True))),
    )


Postings = tuple[dict[str, tuple[int, int]], np.ndarray, np.ndarray]


def postings_of(docs: Sequence[int], posted: Sequence[tuple[str, bytes, bytes]]) -> Postings:
    """The postings of the facts whose documents are `docs` (row i holds docs[i]), from
    the user's postings by term (documents as uint64 bytes, counts as uint32 bytes):
    term -> slice, and the rows and counts grouped by term."""
    n = len(docs)
    row_docs = np.asarray(docs, dtype=np.uint64)
    order = np.argsort(row_docs, kind="stable")
    sorted_docs = row_docs[order]
    lens = np.fromiter((len(d) // 8 for _, d, _ in posted), dtype=np.int64, count=len(posted))
    all_docs = np.frombuffer(b"".join(d for _, d, _ in posted), dtype="<u8")
    all_tfs = np.frombuffer(b"".join(f for _, _, f in posted), dtype="<u4")
    if not n or not len(all_docs):
        return {}, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64)
    pos = np.minimum(np.searchsorted(sorted_docs, all_docs), n - 1)
    hit = sorted_docs[pos] == all_docs
    kept = np.bincount(np.repeat(np.arange(len(posted)), lens)[hit], minlength=len(posted))
    ends = np.cumsum(kept)
    slices = {
        t: (int(e - k), int(e))
        for (t, _, _), k, e in zip(posted, kept.tolist(), ends.tolist(), strict=True)
        if k
    }
    return slices, order[pos[hit]].astype(np.int32), all_tfs[hit].astype(np.float64)


def text_postings(texts: Sequence[str]) -> Postings:
    """The postings of `texts` (row i holds texts[i]) counted here with the postings'
    tokeniser (tests build an index with no server)."""
    rows: dict[str, list[int]] = {}
    tfs: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        for term, tf in Counter(py_terms(text)).items():
            rows.setdefault(term, []).append(i)
            tfs.setdefault(term, []).append(tf)
    slices: dict[str, tuple[int, int]] = {}
    flat_rows: list[int] = []
    flat_tfs: list[int] = []
    for t, r in rows.items():
        slices[t] = (len(flat_rows), len(flat_rows) + len(r))
        flat_rows += r
        flat_tfs += tfs[t]
    return slices, np.asarray(flat_rows, dtype=np.int32), np.asarray(flat_tfs, dtype=np.float64)


def build(
    ids: Sequence[str],
    lengths: Sequence[int],
    models: Sequence[str],
    created: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    vecs: Sequence[bytes],
    *,
    postings: Postings,
) -> ScopeIndex:
    """The index of the facts given column by column (:func:`read`'s columns)."""
    n = len(ids)
    dim = max((len(v) // 4 for v in vecs), default=0)
    sized = np.fromiter((bool(v) and len(v) == 4 * dim for v in vecs), dtype=bool, count=n)
    matrix = np.zeros((n, dim), dtype=np.float32)
    if sized.any():
        joined = b"".join(v for v, keep in zip(vecs, sized.tolist(), strict=True) if keep)
        matrix[sized] = np.frombuffer(joined, dtype="<f4").reshape(-1, dim)
    names = sorted(set(models))
    code = {m: i for i, m in enumerate(names)}
    model_of = np.fromiter((code[m] for m in models), dtype=np.int16, count=n)
    norms = np.linalg.norm(matrix, axis=1)
    ok = sized & np.isfinite(norms) & (norms > 0)
    model_of[~ok] = -1  # no vector, or a zero or broken one (no cosine: the server answers NaN)
    matrix[ok] /= norms[ok, None]
    matrix[~ok] = 0
    order = sorted(range(n), key=ids.__getitem__)
    id_rank = np.empty(n, dtype=np.int32)
    id_rank[order] = np.arange(n, dtype=np.int32)
    # valid_from left at the epoch means "when it was made" (memories.Fact)
    starts_ms = np.array([s if s else c for s, c in zip(starts, created, strict=True)], dtype=np.int64)
    return ScopeIndex(
        ids=list(ids),
        id_rank=id_rank,
        lengths=np.asarray(lengths, dtype=np.float64),
        valid_from=starts_ms,
        valid_until=np.asarray(ends, dtype=np.int64),
        models=names,
        model_of=model_of,
        matrix=matrix,
        postings=postings[0],
        post_rows=postings[1],
        post_tfs=postings[2],
    )


@dataclass(frozen=True)
class Ranked:
    """One leg's hit: an id with its score (BM25 with its matched terms, or similarity)."""

    memory_id: str
    score: float
    matched: tuple[str, ...] = ()


def lexical(index: ScopeIndex, query: str, *, at_ms: int, limit: int) -> list[Ranked]:
    """BM25's best facts valid at `at_ms` (what loom.store.memories.bm25 answers): N, df
    and avgdl of the valid facts; more query terms held first, then score, then id."""
    live = index.live(at_ms)
    n = int(live.sum())
    if not n:
        return []
    avgdl = float(index.lengths[live].mean())
    scores = np.zeros(len(index.ids), dtype=np.float64)
    held = np.zeros(len(index.ids), dtype=np.int32)
    found: dict[str, np.ndarray] = {}
    for term in py_query_terms(query, stem=False):
        span = index.postings.get(term)
        if span is None:
            continue
        rows, tf = index.post_rows[span[0] : span[1]], index.post_tfs[span[0] : span[1]]
        keep = live[rows]
        rows, tf = rows[keep], tf[keep]
        if not len(rows):
            continue
        df = len(rows)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        scores[rows] += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * index.lengths[rows] / avgdl))
        held[rows] += 1
        found[term] = rows
    cand = np.flatnonzero((held > 0) & (scores > 0))
    best = cand[np.lexsort((index.id_rank[cand], -scores[cand], -held[cand]))][:limit]
    matched: dict[int, list[str]] = {i: [] for i in best.tolist()}
    for term, rows in found.items():  # in the query's order, as the one read gives them
        for i in best[np.isin(best, rows)].tolist():
            matched[i].append(term)
    return [Ranked(index.ids[i], float(scores[i]), tuple(matched[i])) for i in best.tolist()]


def vector(
    index: ScopeIndex,
    query: Sequence[float] | np.ndarray,
    model: str,
    *,
    at_ms: int,
    limit: int,
    min_similarity: float,
) -> list[Ranked]:
    """The facts valid at `at_ms` and embedded by `model`, by cosine similarity to `query`
    (what loom.store.memories.vector_search answers), best first, ties by id."""
    q = np.asarray(query, dtype=np.float32)
    norm = float(np.linalg.norm(q))
    if model not in index.models or index.matrix.shape[1] != len(q) or not norm:
        return []
    sims = index.matrix @ (q / norm)
    mine = index.live(at_ms) & (index.model_of == index.models.index(model))
    sims[~mine] = -np.inf
    k = min(limit, int(mine.sum()))
    if k <= 0:
        return []
    top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    top = top[np.lexsort((index.id_rank[top], -sims[top]))]
    return [Ranked(index.ids[i], float(sims[i])) for i in top.tolist() if sims[i] >= min_similarity]
