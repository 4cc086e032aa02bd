"""The embedder interface every provider implements, and its error type.

An embedder turns texts into unit-length float32 vectors. It is synchronous: callers
run it in worker threads or processes, never on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

#: The array type :meth:`Embedder.embed` returns: shape ``(n, dim)``, float32.
Vectors = npt.NDArray[np.float32]


class EmbedderError(Exception):
    """An embedding provider failed (network, bad response, model error)."""


class Picklable:
    """An embedder a process pool can copy: the copy leaves behind its lock and what
    `_left_behind` names (a loaded model, an open client: each set to the empty value
    given), which it opens again on first use, and makes a lock of its own."""

    _left_behind: ClassVar[Mapping[str, Any]] = {}
    _lock: threading.Lock

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None, **self._left_behind}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@runtime_checkable
class Embedder(Protocol):
    """A text embedding model.

    ``model_id`` is recorded on every embedding row, so two embedders that return
    comparable vectors must share it and two that do not must differ.
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed ``texts``: shape ``(len(texts), dim)``, float32, each row L2-normalised.

        Rows are in input order. An empty input gives an empty ``(0, dim)`` array.
        Raises :class:`EmbedderError` when the provider fails.
        """
        ...


def check_texts(texts: Sequence[str]) -> list[str]:
    """The input as a list of str; rejects a bare string (a classic bug: one vector per character)."""
    if isinstance(texts, str | bytes):
        raise TypeError("embed() takes a sequence of texts, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"embed() texts[{i}] is {type(t).__name__}, not str")
    return out


def empty(dim: int) -> Vectors:
    return np.zeros((0, dim), dtype=np.float32)


def l2_normalise(vectors: npt.NDArray[np.floating], *, what: str = "embedding") -> Vectors:
    """Rows scaled to unit L2 length, as float32. Zero or non-finite rows raise EmbedderError."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2:
        raise EmbedderError(f"{what}: expected a 2-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise EmbedderError(f"{what}: vector holds NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if arr.shape[0] and float(norms.min()) <= 0.0:
        raise EmbedderError(f"{what}: zero-length vector cannot be normalised")
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def query_vectors(embedder: Embedder, texts: Sequence[str]) -> Vectors:
    """Vectors of search queries. An asymmetric model (e5: ``query: `` against
    ``passage: ``) embeds queries by its own ``embed_query``; the others embed a query as
    any text."""
    embed_query = getattr(embedder, "embed_query", None)
    return embed_query(texts) if callable(embed_query) else embedder.embed(texts)
