"""Embedding in the API process, for one or a few short texts where a round trip
through the worker pool would cost more than the model call: a search's query and a
saved message (`conversation.save_message`).

Append's embeddings stay in the worker pool (they are batched across requests there);
this embedder is built from the same settings, so its vectors and `model_id` match the
worker's. It is built lazily (the first search or save pays the model load) and runs
in one thread of its own, single-threaded, so it never competes with the event loop.

Callers must screen text with :mod:`loom.sensitivity` first: nothing that reads as
high may reach :func:`embed`.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from loom import failures
from loom import logging as loom_logging
from loom.providers.embedders import Embedder, build_embedder, query_vectors, single_threaded
from loom.services import Services, Slot

_KEY = "conversation.inline_embedder"

log = loom_logging.get("loom.conversation.inline_embedding")


@dataclass(kw_only=True)
class InlineResult:
    """Vectors for every text, or the error that kept them all from one."""

    vectors: list[np.ndarray] | None
    model_id: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.vectors is not None and not self.error


class _Holder:
    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.embedder: Embedder | None = None
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="loom-inline-embed")

    def get(self) -> Embedder:
        with self.lock:
            if self.embedder is None:
                s = self.svc.settings
                extra = single_threaded(s.embedder)
                self.embedder = build_embedder(
                    s.embedder,
                    url=s.embedder_url,
                    model=s.embedder_model,
                    api_key=s.embedder_api_key,
                    timeout_seconds=s.embedder_timeout_seconds,
                    **extra,
                )
            return self.embedder

    def embed(self, texts: list[str], query: bool = False) -> tuple[list[np.ndarray], str]:
        embedder = self.get()
        vectors = query_vectors(embedder, texts) if query else embedder.embed(texts)
        if len(vectors) != len(texts):
            raise RuntimeError(f"embedder returned {len(vectors)} vectors for {len(texts)} texts")
        return [np.asarray(v, dtype=np.float32) for v in vectors], embedder.model_id


_HOLDER: Slot[_Holder] = Slot(_KEY)


def _holder(svc: Services) -> _Holder:
    return _HOLDER.made(svc, lambda: _Holder(svc))


def install(svc: Services, embedder: Embedder | None) -> Embedder | None:
    """Swap this process's inline embedder (tests: failing or spying ones); None rebuilds
    from settings on next use. Returns the one replaced."""
    holder = _holder(svc)
    with holder.lock:
        previous, holder.embedder = holder.embedder, embedder
    return previous


def current(svc: Services) -> Embedder:
    return _holder(svc).get()


async def embed(
    svc: Services, texts: list[str], *, timeout: float | None = None, query: bool = False
) -> InlineResult:
    """Embed `texts` (already screened for sensitivity); `query`: they are search queries
    (an asymmetric model embeds those its own way, loom.providers.embedders.query_vectors). Never raises for a provider
    failure or a timeout (LOOM_EMBEDDER_TIMEOUT_SECONDS by default): the result carries
    the error (a code, loom.failures) so the caller can fall back (search) or fail open
    (save)."""
    holder = _holder(svc)
    wait = timeout if timeout is not None else svc.settings.embedder_timeout_seconds
    loop = asyncio.get_running_loop()
    try:
        vectors, model_id = await asyncio.wait_for(
            loop.run_in_executor(holder.executor, holder.embed, texts, query), wait
        )
    except TimeoutError:
        return InlineResult(vectors=None, model_id="", error=failures.text(failures.EMBEDDER_TIMEOUT))
    except Exception as exc:  # fail-open: the caller decides what an unavailable embedder means
        log.warning("inline embedding failed", error=failures.detail(exc, sent=texts), texts=len(texts))
        return InlineResult(vectors=None, model_id="", error=failures.embed_failure(exc))
    return InlineResult(vectors=vectors, model_id=model_id)


__all__ = ["InlineResult", "current", "embed", "install"]
