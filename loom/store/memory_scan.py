"""memory.search's one-read path: a scope's live facts whole, in one round trip that
runs while the query is embedded, then both legs ranked here.

A user's scope usually holds tens to hundreds of facts. For such a scope, one read of
every live fact (newest version, FINAL) answers everything the search needs, before the
query vector exists: each fact's row, its BM25 length and its vector (as raw float32
bytes, which cost neither side a text parse). Each fact's terms are counted here with
the tokeniser the postings are written with (loom.store.bm25.py_terms, held equal to the
SQL by a test), so they equal the postings a `memory_terms` read would give; the read
serves any query, so the API process may keep it (loom.ops.memory.scan_cache). Both
legs are then ranked in the API process, exactly as the server-side legs rank:

* BM25: N and avgdl are those of the scope's live facts, df the number of them holding
  a term; scored by :func:`loom.store.memories.bm25_scores`.
* vector: cosine similarity to the query vector, over the live facts embedded by the
  query's model, best first, ties by memory_id.

A scope holding more than ``cap`` live facts answers ``None`` (the read stops after cap + 1
rows): the caller then uses the two server-side legs (postings BM25, exact cosine in
ClickHouse), which do not send the scope's rows over the wire.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.clock import utcnow
from loom.store.bm25 import py_query_terms, py_terms
from loom.store.memories import (
    _READ_RANKED,
    TABLE,
    Fact,
    LexicalHit,
    Scope,
    VectorHit,
    live,
    rank_scored,
    unclosed,
)

# Each current fact's row whole, its BM25 length and its vector as raw bytes. The
# tokenising is done in this process (bm25.py_terms, held equal to the server's), so the
# read carries no per-row string work and its result serves any query (a cache of it,
# loom.ops.memory.scan_cache, answers later searches with no round trip).
_READ = f"""
SELECT {_READ_RANKED}, doc_len AS _dl, reinterpret(embedding, 'String') AS _vec
FROM memories FINAL
WHERE {{scope}} AND {{valid}}
LIMIT {{cap:UInt32}}
"""


@dataclass(frozen=True)
class ScopeRows:
    """A scope's facts as read, for any query: what both legs rank by."""

    facts: list[Fact]
    lengths: list[int]  # BM25 document length of each fact (the server's doc_len)
    vectors: list[bytes]  # float32 little-endian, empty when the fact has no vector
    tokens: list[Counter[str]]  # each fact's terms with their counts (bm25.py_terms)

    @property
    def nbytes(self) -> int:
        """About what the rows hold in memory (for a cache's budget)."""
        return sum(
            600 + 2 * len(f.text) + 80 * len(f.evidence_ids) + len(v) + 120 * len(t)
            for f, v, t in zip(self.facts, self.vectors, self.tokens, strict=True)
        )


@dataclass(frozen=True)
class ScopeScan:
    """Every live fact of a scope, with what both legs rank by for one query."""

    facts: list[Fact]
    lengths: list[int]  # BM25 document length of each fact
    vectors: list[bytes]  # float32 little-endian, empty when the fact has no vector
    terms: list[list[tuple[str, int]]]  # each fact's query terms with their counts


def read(
    ch: Client, scope: Scope, *, cap: int, now: datetime, as_of: datetime | None = None
) -> ScopeRows | None:
    """The scope's facts in one read, or None when it holds more than `cap`. Without
    `as_of`: the facts not forgotten, not superseded and not closed by `now` (a fact
    whose validity starts or ends later is read too: :func:`select` keeps those valid
    at the search's own time, so the rows stay right while they are cached); with
    `as_of`, the facts valid then."""
    if as_of is None:
        valid, vparams = unclosed(now)
    else:
        valid, vparams = live(as_of, now)
    result = ch.query(
        _READ.replace("{scope}", scope.where()).replace("{valid}", valid),
        parameters=scope.params() | {"cap": cap + 1} | vparams,
        column_formats={"_vec": "bytes"},
    )
    rows = TABLE.rows_with(result)
    if len(rows) > cap:
        return None
    return ScopeRows(
        facts=[f for f, _ in rows],
        lengths=[int(own["_dl"]) for _, own in rows],
        vectors=[own["_vec"] for _, own in rows],
        tokens=[Counter(py_terms(f.text)) for f, _ in rows],
    )


def select(rows: ScopeRows, query: str, *, at: datetime | None) -> ScopeScan:
    """The facts of `rows` valid at `at` (all of them when None), with `query`'s terms
    each holds (the query tokenised as the server does: distinct, first seen first)."""
    qterms = py_query_terms(query, stem=False)
    keep = [i for i, f in enumerate(rows.facts) if at is None or f.valid_at(at)]
    return ScopeScan(
        facts=[rows.facts[i] for i in keep],
        lengths=[rows.lengths[i] for i in keep],
        vectors=[rows.vectors[i] for i in keep],
        terms=[[(t, rows.tokens[i][t]) for t in qterms if t in rows.tokens[i]] for i in keep],
    )


def scan(
    ch: Client, scope: Scope, query: str, *, cap: int, as_of: datetime | None = None
) -> ScopeScan | None:
    """The scope's current facts (or those valid at `as_of`) for `query` in one read, or
    None when it holds more than `cap`."""
    now = utcnow()
    rows = read(ch, scope, cap=cap, now=now, as_of=as_of)
    if rows is None:
        return None
    return select(rows, query, at=now if as_of is None else None)


def lexical(found: ScopeScan, *, limit: int) -> list[LexicalHit]:
    """BM25's best facts of the scan (what :func:`loom.store.memories.bm25` answers)."""
    n = len(found.facts)
    if not n:
        return []
    avgdl = sum(found.lengths) / n
    pairs = [
        (f.memory_id, term, tf, dl, n, avgdl)
        for f, dl, held in zip(found.facts, found.lengths, found.terms, strict=True)
        for term, tf in held
    ]
    return rank_scored(pairs, {f.memory_id: f for f in found.facts}, limit=limit)


def vector(
    found: ScopeScan, query: Sequence[float] | np.ndarray, model: str, *, limit: int, min_similarity: float
) -> list[VectorHit]:
    """The scan's facts embedded by `model`, by cosine similarity to `query` (what
    :func:`loom.store.memories.vector_search` answers)."""
    q = np.asarray(query, dtype=np.float64)
    width = 4 * len(q)
    mine = [
        i
        for i, (f, v) in enumerate(zip(found.facts, found.vectors, strict=True))
        if f.model == model and len(v) == width and width > 0
    ]
    if not mine:
        return []
    flat = np.frombuffer(b"".join(found.vectors[i] for i in mine), dtype="<f4")
    matrix = flat.reshape(len(mine), len(q)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        sims = matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
    ranked = sorted(
        ((float(s), i) for i, s in zip(mine, sims, strict=True) if np.isfinite(s)),
        key=lambda si: (-si[0], found.facts[si[1]].memory_id),
    )[:limit]
    return [VectorHit(found.facts[i].memory_id, s, found.facts[i]) for s, i in ranked if s >= min_similarity]
