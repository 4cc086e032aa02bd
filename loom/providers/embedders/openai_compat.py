"""An embedder that calls an OpenAI-compatible ``POST {base_url}/v1/embeddings``.

Works with OpenAI, Azure-style gateways, vLLM, text-embeddings-inference, Ollama, LiteLLM
and anything else that speaks the same JSON. Vectors are re-normalised on arrival and
their dimension is checked against :attr:`OpenAICompatEmbedder.dim`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from loom.providers._http import auth_headers, endpoint, json_body, request_failure
from loom.providers.embedders.base import EmbedderError, Picklable, Vectors, check_texts, empty, l2_normalise

#: Output sizes of well-known hosted models, used when ``dim`` is not given.
KNOWN_DIMS: dict[str, int] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
    "all-MiniLM-L6-v2": 384,
    "sentence-transformers/all-MiniLM-L6-v2": 384,
    "all-minilm": 384,
    "nomic-embed-text": 768,
    "mxbai-embed-large": 1024,
}
DEFAULT_DIM = 384


class OpenAICompatEmbedder(Picklable):
    """Embeds over HTTP with the OpenAI embeddings protocol (sync, one reused httpx.Client)."""

    # A process pool gets a copy without the client; it opens its own on first use.
    _left_behind = {"_client": None}

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 10.0,
        dim: int | None = None,
        batch_size: int = 256,
        model_id: str | None = None,
    ) -> None:
        if not model:
            raise ValueError("model is required for the OpenAI-compatible embedder")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.url = endpoint(base_url, "embeddings")
        self.model = model
        self.timeout = float(timeout)
        self.batch_size = batch_size
        self.dim = int(dim) if dim is not None else KNOWN_DIMS.get(model, DEFAULT_DIM)
        if self.dim < 1:
            raise ValueError("dim must be >= 1")
        self.model_id = model_id or model
        self._api_key = api_key or None
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = httpx.Client(
                        timeout=httpx.Timeout(self.timeout), headers=auth_headers(self._api_key)
                    )
                    self._client = client
        return client

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        parts = [
            self._embed_batch(items[i : i + self.batch_size]) for i in range(0, len(items), self.batch_size)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def _embed_batch(self, batch: list[str]) -> Vectors:
        where = f"embedder {self.model!r} at {self.url}"
        try:
            resp = self._http().post(self.url, json={"model": self.model, "input": batch})
        except httpx.HTTPError as exc:
            raise EmbedderError(request_failure(exc, where, self.timeout)) from exc
        body = json_body(resp, where, EmbedderError)
        rows = self._parse(body, len(batch), where)
        return l2_normalise(np.asarray(rows, dtype=np.float32), what=where)

    def _parse(self, body: Any, n: int, where: str) -> list[list[float]]:
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            raise EmbedderError(f"{where}: malformed response, no 'data' list")
        data = body["data"]
        if len(data) != n:
            raise EmbedderError(f"{where}: sent {n} texts, got {len(data)} embeddings")
        rows: list[list[float] | None] = [None] * n
        for pos, item in enumerate(data):
            if not isinstance(item, dict):
                raise EmbedderError(f"{where}: malformed response, data[{pos}] is not an object")
            index = item.get("index", pos)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
                raise EmbedderError(f"{where}: malformed response, data[{pos}].index is {index!r}")
            if rows[index] is not None:
                raise EmbedderError(f"{where}: malformed response, index {index} appears twice")
            vec = item.get("embedding")
            if not isinstance(vec, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vec
            ):
                raise EmbedderError(
                    f"{where}: malformed response, data[{pos}].embedding is not a list of finite numbers"
                )
            if len(vec) != self.dim:
                raise EmbedderError(
                    f"{where}: dimension mismatch, got {len(vec)}-d vectors, expected {self.dim} "
                    "(set the embedder's dim to match the model)"
                )
            rows[index] = vec
        return [r for r in rows if r is not None]

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> OpenAICompatEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAICompatEmbedder(url={self.url!r}, model={self.model!r}, dim={self.dim})"
