"""Embedding providers (design §4): MiniLM (default), e5-small, OpenAI-compatible HTTP, and test fakes.

``build_embedder(kind, **opts)`` makes one from settings::

    build_embedder("minilm")                                  # local all-MiniLM-L6-v2 int8
    build_embedder("e5-small")                                # local multilingual-e5-small 4-bit
    build_embedder("openai", url=..., model=..., api_key=..., timeout_seconds=10)
    build_embedder("fake")                                    # deterministic hashing fake
"""

from __future__ import annotations

import inspect
from typing import Any

from loom.providers.embedders.base import Embedder, EmbedderError, Vectors, l2_normalise, query_vectors
from loom.providers.embedders.e5small import E5SmallEmbedder
from loom.providers.embedders.fake import FakeEmbedder, SpyEmbedder
from loom.providers.embedders.minilm import MiniLMEmbedder
from loom.providers.embedders.openai_compat import OpenAICompatEmbedder

__all__ = [
    "EMBEDDER_KINDS",
    "E5SmallEmbedder",
    "Embedder",
    "EmbedderError",
    "FakeEmbedder",
    "MiniLMEmbedder",
    "OpenAICompatEmbedder",
    "SpyEmbedder",
    "Vectors",
    "build_embedder",
    "l2_normalise",
    "query_vectors",
    "single_threaded",
]

EMBEDDER_KINDS = ("minilm", "e5-small", "openai", "fake")

_CLASSES: dict[str, type] = {
    "minilm": MiniLMEmbedder,
    "e5-small": E5SmallEmbedder,
    "openai": OpenAICompatEmbedder,
    "fake": FakeEmbedder,
}
# Settings-style names accepted for the constructor's own.
_ALIASES = {"url": "base_url", "timeout_seconds": "timeout"}
# Connection options only the HTTP provider uses; the local kinds ignore them, so the
# caller can pass every LOOM_EMBEDDER_* setting whatever the kind.
_REMOTE_ONLY = {"base_url", "model", "api_key", "timeout"}


def _options(cls: type, kind: str, opts: dict[str, Any], ignorable: set[str]) -> dict[str, Any]:
    """``opts`` with unset values (None, "") dropped, aliases resolved, and names checked."""
    accepted = {
        name
        for name, p in inspect.signature(cls).parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if value is None or value == "":
            continue
        name = _ALIASES.get(key, key)
        if name in accepted:
            out[name] = value
        elif name not in ignorable:
            raise ValueError(
                f"unknown option {key!r} for the {kind!r} embedder; accepted: {', '.join(sorted(accepted))}"
            )
    return out


def build_embedder(kind: str, **opts: Any) -> Embedder:
    """An embedder of ``kind`` ("minilm", "e5-small", "openai" or "fake") built from keyword options.

    Options set to ``None`` or ``""`` count as unset (settings use "" for unset). The
    connection options (``url``/``base_url``, ``model``, ``api_key``,
    ``timeout``/``timeout_seconds``) are ignored by the local kinds. "openai" needs
    ``url`` and ``model``. Unknown kinds and option names raise ValueError.
    """
    key = (kind or "").strip().lower()
    cls = _CLASSES.get(key)
    if cls is None:
        raise ValueError(f"unknown embedder kind {kind!r}; expected one of {', '.join(EMBEDDER_KINDS)}")
    if key == "openai":
        args = _options(cls, key, opts, set())
        missing = [n for n in ("base_url", "model") if n not in args]
        if missing:
            names = {"base_url": "url (LOOM_EMBEDDER_URL)", "model": "model (LOOM_EMBEDDER_MODEL)"}
            raise ValueError("the 'openai' embedder needs " + " and ".join(names[m] for m in missing))
    else:
        args = _options(cls, key, opts, _REMOTE_ONLY)
    embedder: Embedder = cls(**args)
    return embedder


def single_threaded(kind: str) -> dict[str, Any]:
    """The options that make a local embedder of ``kind`` run its model on one thread
    (the API's inline embedder and the worker's parallel calls); none for the others."""
    return {"minilm": {"intra_op_num_threads": 1}, "e5-small": {"num_threads": 1}}.get(kind, {})
