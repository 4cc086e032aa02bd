"""One namespace's live vectors in memory, ranked exactly.

Every live vector of a recorded turn is a row of one float32 matrix per dimension (unit
vectors: cosine similarity is one matrix-vector product, BLAS's own loop), beside the
columns a search filters on (thread, run, role, agent, model, as small integer codes)
and what a hit shows (owner, time, the embedding row's text). A removed row's slot is
reused by the next insert. An exact scan of 100k rows costs one pass over 150 MB; the
engine's path (HNSW over bf16) stays for namespaces the index does not hold.

Rows carry their embedding row's version: an event older than what the index holds for
a key (live or removed) changes nothing, so events may be applied twice or out of order
(a reload and the stream meeting) and the newest version still wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from loom.read_index.feed import Row, TurnCopy

Key = tuple[str, str]  # (thread_id, msg_id)
_GROW = 1.5
_ROW_OVERHEAD = (
    1_450  # bytes per row beyond its vector and text: the row, its strings, dict entries (measured)
)


@dataclass(frozen=True)
class TurnFilters:
    """The filters on the turn every vector search takes, in the index or in the store
    (loom.store.search.Filters); None: any."""

    thread_id: str | None = None
    run_id: str | None = None
    role: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class Wanted(TurnFilters):
    """A search's filters (None: any)."""

    model: str | None = None


@dataclass(frozen=True)
class Found(TurnCopy):
    """A ranked row, with what a hit shows."""

    ts_us: int
    text: str
    similarity: float

    @classmethod
    def of(cls, row: Row, similarity: float) -> Found:
        """`row` as a hit (its fields of the same names) at `similarity`."""
        return cls(**{name: getattr(row, name) for name in _FROM_ROW}, similarity=similarity)

    def values(self) -> list[Any]:
        """Its fields after the namespace, in declaration order: a row of the search
        answer (after the namespace it was searched under)."""
        return [getattr(self, name) for name in _ANSWERED]


_FROM_ROW = tuple(f.name for f in fields(Found) if f.name != "similarity")
_ANSWERED = tuple(f.name for f in fields(Found) if f.name != "namespace")


class _Codes:
    """Strings as small integers (a filter compares codes, not strings)."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.names: list[str] = []

    def code(self, name: str) -> int:
        got = self.of.get(name)
        if got is None:
            got = self.of[name] = len(self.names)
            self.names.append(name)
        return got


@dataclass
class _Matrix:
    """The rows of one dimension."""

    dim: int
    vectors: np.ndarray = field(init=False)
    live: np.ndarray = field(init=False)
    cols: dict[str, np.ndarray] = field(init=False)  # thread, run, role, agent, model codes
    n: int = 0  # slots used (live or free)
    free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.vectors = np.zeros((0, self.dim), dtype=np.float32)
        self.live = np.zeros(0, dtype=bool)
        self.cols = {c: np.zeros(0, dtype=np.int32) for c in _FILTERED}

    def slot(self) -> int:
        if self.free:
            return self.free.pop()
        if self.n == len(self.live):
            cap = max(64, int(self.n * _GROW))
            self.vectors = np.resize(self.vectors, (cap, self.dim))
            self.live = np.concatenate([self.live, np.zeros(cap - len(self.live), dtype=bool)])
            for c, arr in self.cols.items():
                self.cols[c] = np.concatenate([arr, np.zeros(cap - len(arr), dtype=np.int32)])
        self.n += 1
        return self.n - 1


_FILTERED = ("thread_id", "run_id", "role", "agent", "model")


class NamespaceVectors:
    """One namespace's rows (module docstring)."""

    def __init__(self) -> None:
        self.codes = {c: _Codes() for c in _FILTERED}
        self.matrices: dict[int, _Matrix] = {}
        self.where: dict[Key, tuple[int, int]] = {}  # key -> (dim, slot)
        self.rows: dict[tuple[int, int], Row] = {}  # (dim, slot) -> its row
        self.versions: dict[Key, int] = {}  # newest version seen per key (removals too)
        self.text_bytes = 0

    def __len__(self) -> int:
        return len(self.where)

    @property
    def nbytes(self) -> int:
        vec = sum(m.vectors.nbytes for m in self.matrices.values())
        return vec + self.text_bytes + _ROW_OVERHEAD * len(self.versions)

    def made_only_by(self, model: str) -> bool:
        """Whether every live vector held was made by `model` (or none is held): only then
        may a query of that model be answered from here. A namespace part-way through a
        change of model (its other vectors staged in the engine's tables, never fed here)
        is read from the engine."""
        code = self.codes["model"].of.get(model)
        if code is not None and len(self.codes["model"].names) == 1:
            return True
        for m in self.matrices.values():
            live = m.live[: m.n]
            if code is None and live.any():
                return False
            if code is not None and (live & (m.cols["model"][: m.n] != code)).any():
                return False
        return True

    def apply(self, row: Row) -> bool:
        """Add, replace or remove the row's key by its version (False: older than held)."""
        key = row.key
        if self.versions.get(key, -1) > row.version:
            return False
        self.versions[key] = row.version
        self._remove(key)
        vec = row.vector
        if vec is None or not len(vec):
            return True
        norm = float(np.linalg.norm(vec))
        if not np.isfinite(norm) or norm == 0:
            return True  # a zero vector ranks nowhere (the engine answers NaN for it)
        m = self.matrices.get(len(vec))
        if m is None:
            m = self.matrices[len(vec)] = _Matrix(len(vec))
        s = m.slot()
        m.vectors[s] = vec / norm
        m.live[s] = True
        for c in _FILTERED:
            m.cols[c][s] = self.codes[c].code(getattr(row, c))
        self.where[key] = (m.dim, s)
        self.rows[(m.dim, s)] = replace(row, vector=None)  # the matrix holds it: not its buffer too
        self.text_bytes += len(row.text) + 49
        return True

    def load(self, rows: list[Row]) -> None:
        """A whole namespace's rows into an empty instance: what :meth:`apply` does row by
        row, in bulk (a rebuild's read holds one row per key)."""
        if self.versions:
            for r in rows:
                self.apply(r)
            return
        self.versions = {r.key: r.version for r in rows}
        by_dim: dict[int, list[Row]] = {}
        for r in rows:
            if r.vector is not None and len(r.vector):
                by_dim.setdefault(len(r.vector), []).append(r)
        for dim, found in by_dim.items():
            vecs = np.stack([r.vector for r in found if r.vector is not None]).astype(np.float32, copy=False)
            norms = np.linalg.norm(vecs, axis=1)
            ok = np.isfinite(norms) & (norms > 0)  # a zero vector ranks nowhere
            kept = [r for r, good in zip(found, ok.tolist(), strict=True) if good]
            m = _Matrix(dim)
            m.vectors = vecs[ok] / norms[ok, None]
            m.live = np.ones(len(kept), dtype=bool)
            m.n = len(kept)
            for c in _FILTERED:
                code = self.codes[c].code
                m.cols[c] = np.fromiter((code(getattr(r, c)) for r in kept), dtype=np.int32, count=len(kept))
            self.matrices[dim] = m
            self.where.update({r.key: (dim, i) for i, r in enumerate(kept)})
            self.rows.update({(dim, i): replace(r, vector=None) for i, r in enumerate(kept)})
            self.text_bytes += sum(len(r.text) + 49 for r in kept)

    def _remove(self, key: Key) -> None:
        at = self.where.pop(key, None)
        if at is None:
            return
        m = self.matrices[at[0]]
        m.live[at[1]] = False
        m.free.append(at[1])
        old = self.rows.pop(at)
        self.text_bytes -= len(old.text) + 49

    def replace_thread(self, thread_id: str, rows: Iterable[Row]) -> None:
        """The thread as a read of the store found it: its rows not in `rows` go (a
        removal no event carried), the others are applied by version."""
        rows = list(rows)
        kept = {r.key for r in rows}
        for key in [k for k in self.where if k[0] == thread_id and k not in kept]:
            self._remove(key)
        for key in [k for k in self.versions if k[0] == thread_id and k not in kept]:
            del self.versions[key]
        for r in rows:
            if self.versions.get(r.key, -1) < r.version:
                self.apply(r)

    def search(self, query: np.ndarray, wanted: Wanted, limit: int) -> tuple[list[Found], int]:
        """The `limit` rows most similar to `query` passing the filters, best first (ties
        by key), and how many rows passed them."""
        m = self.matrices.get(int(query.shape[0]))
        if m is None or not m.n:
            return [], 0
        mask = m.live[: m.n]
        for c in _FILTERED:
            value = getattr(wanted, c)
            if value is not None:
                code = self.codes[c].of.get(value)
                if code is None:
                    return [], 0
                mask = mask & (m.cols[c][: m.n] == code)
        slots = np.flatnonzero(mask)
        if not len(slots):
            return [], 0
        q = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        if not norm:
            return [], len(slots)
        q = q / norm
        sims = m.vectors[slots] @ q if len(slots) < m.n // 2 else (m.vectors[: m.n] @ q)[slots]
        k = min(limit, len(slots))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(slots) else np.arange(len(slots))
        found = []
        for i in top.tolist():
            r = self.rows[(m.dim, int(slots[i]))]
            found.append(Found.of(r, float(sims[i])))
        found.sort(key=lambda f: (-f.similarity, f.thread_id, f.msg_id))
        return found, len(slots)
