"""memory.search's one-read path: a scope's live facts whole, in one round trip that
runs while the query is embedded, then both legs ranked here.

A user's scope usually holds tens to hundreds of facts. For such a scope, one read of
every live fact (newest version, FINAL) answers everything the search needs, before the
query vector exists: each fact's row, its BM25 length, its vector (as raw float32 bytes,
which cost neither side a text parse) and, for each query term it holds, how often (the
term counts are taken from the fact's text with the same tokeniser the postings are
written with, so they equal the postings a `memory_terms` read would give). Both legs
are then ranked in the API process, exactly as the server-side legs rank:

* BM25: N and avgdl are those of the scope's live facts, df the number of them holding
  a term; scored by :func:`loom.store.memories.bm25_scores`.
* vector: cosine similarity to the query vector, over the live facts embedded by the
  query's model, best first, ties by memory_id.

A scope holding more than ``cap`` live facts answers ``None`` (the read stops after cap + 1
rows): the caller then uses the two server-side legs (postings BM25, exact cosine in
ClickHouse), which do not send the scope's rows over the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.store.bm25 import query_terms_sql, stop_words_param, terms_sql
from loom.store.memories import (
    _READ_RANKED,
    TABLE,
    Fact,
    LexicalHit,
    Scope,
    VectorHit,
    rank_scored,
)

# The query's terms, and each row's terms (the tokeniser of the postings' view), as aliases.
_SCAN = f"""
WITH {query_terms_sql("{q:String}", stem=False)} AS qterms,
     {terms_sql("text")} AS toks
SELECT {_READ_RANKED}, doc_len AS _dl, reinterpret(embedding, 'String') AS _vec,
       arrayFilter(t -> has(toks, t), qterms) AS _terms,
       arrayMap(t -> toUInt32(countEqual(toks, t)), _terms) AS _tfs
FROM memories FINAL
WHERE {{scope}} AND NOT tombstoned
LIMIT {{cap:UInt32}}
"""


@dataclass(frozen=True)
class ScopeScan:
    """Every live fact of a scope, with what both legs rank by."""

    facts: list[Fact]
    lengths: list[int]  # BM25 document length of each fact
    vectors: list[bytes]  # float32 little-endian, empty when the fact has no vector
    terms: list[list[tuple[str, int]]]  # each fact's query terms with their counts


def scan(ch: Client, scope: Scope, query: str, *, cap: int) -> ScopeScan | None:
    """The scope's live facts for `query` in one read, or None when it holds more than `cap`."""
    result = ch.query(
        _SCAN.replace("{scope}", scope.where()),
        parameters=scope.params() | {"q": query, "stop": stop_words_param(), "cap": cap + 1},
        column_formats={"_vec": "bytes"},
    )
    rows = TABLE.rows_with(result)
    if len(rows) > cap:
        return None
    return ScopeScan(
        facts=[f for f, _ in rows],
        lengths=[int(own["_dl"]) for _, own in rows],
        vectors=[own["_vec"] for _, own in rows],
        terms=[list(zip(own["_terms"], (int(t) for t in own["_tfs"]), strict=True)) for _, own in rows],
    )


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
