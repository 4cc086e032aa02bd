"""Test embedders: a deterministic hashing fake, and a spy that wraps any embedder."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from loom.providers.embedders.base import Embedder, EmbedderError, Vectors, check_texts, empty, query_vectors

_WORD = re.compile(r"\w+")
_EMPTY_TOKEN = "\x00<empty>"


class FakeEmbedder:
    """Bag-of-words hashing: each lowercased word adds 1 to a seeded-hash bucket.

    * identical texts give identical vectors; the same words in any order do too;
    * texts that share a word have cosine > 0 (all weights are non-negative), texts with
      no word in common have cosine 0 unless two words share a bucket;
    * a text with no words maps to one fixed vector.

    For tests: ``fail=True`` makes every call raise :class:`EmbedderError`;
    ``fail_on(text)`` returning true for any text of a batch fails that batch;
    ``delay_seconds`` sleeps before answering. Every batch is recorded in ``calls``
    (also the ones that then fail).
    """

    def __init__(
        self,
        dim: int = 384,
        *,
        seed: int = 0,
        fail: bool = False,
        fail_on: Callable[[str], bool] | None = None,
        delay_seconds: float = 0.0,
        model_id: str | None = None,
    ) -> None:
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.dim = dim
        self.seed = seed
        self.fail = fail
        self.fail_on = fail_on
        self.delay_seconds = delay_seconds
        self.model_id = model_id or f"fake-hash-{dim}"
        self.calls: list[list[str]] = []
        self._key = seed.to_bytes(8, "little", signed=True)
        self._lock = threading.Lock()

    @property
    def texts(self) -> list[str]:
        """Every text embedded so far, in call order."""
        with self._lock:
            return [t for batch in self.calls for t in batch]

    def _bucket(self, token: str) -> int:
        h = hashlib.blake2b(token.encode("utf-8"), digest_size=8, key=self._key)
        return int.from_bytes(h.digest(), "little") % self.dim

    def vector(self, text: str) -> Vectors:
        """The (normalised) vector of one text, shape ``(dim,)``."""
        v = np.zeros(self.dim, dtype=np.float32)
        words = _WORD.findall(text.lower()) or [_EMPTY_TOKEN]
        for w in words:
            v[self._bucket(w)] += 1.0
        return (v / np.linalg.norm(v)).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        with self._lock:
            self.calls.append(list(items))
        if self.delay_seconds > 0:
            time.sleep(self.delay_seconds)
        if self.fail:
            raise EmbedderError("FakeEmbedder: failing as configured (fail=True)")
        if self.fail_on is not None:
            for t in items:
                if self.fail_on(t):
                    raise EmbedderError(f"FakeEmbedder: failing on text {t[:60]!r} as configured (fail_on)")
        if not items:
            return empty(self.dim)
        return np.stack([self.vector(t) for t in items])

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()

    def __repr__(self) -> str:
        return f"FakeEmbedder(dim={self.dim}, seed={self.seed}, fail={self.fail})"


class SpyEmbedder:
    """Wraps any embedder and records what it was asked to embed.

    ``calls`` holds every batch (as sent, including ones the inner embedder then failed
    on), ``texts`` every text flattened; ``model_id`` and ``dim`` are the inner ones.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id: str = inner.model_id
        self.dim: int = inner.dim
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    @property
    def texts(self) -> list[str]:
        with self._lock:
            return [t for batch in self.calls for t in batch]

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        with self._lock:
            self.calls.append(list(items))
        return self.inner.embed(items)

    def embed_query(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        with self._lock:
            self.calls.append(list(items))
        return query_vectors(self.inner, items)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()

    def __repr__(self) -> str:
        return f"SpyEmbedder({self.inner!r})"
