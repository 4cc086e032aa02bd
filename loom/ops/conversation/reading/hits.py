"""One hit of conversation.search: what the search answers of a turn (its module,
loom.ops.conversation.reading.searching, and the re-ranker, search_rerank, share it)."""

from __future__ import annotations

from dataclasses import dataclass

from loom.store.keys import TurnRef


@dataclass(frozen=True)
class Hit(TurnRef):
    similarity: float | None
    excerpt: str
    score: float | None = None  # the mode's own score (module docstring); None for substring hits
    legs: tuple[str, ...] = ()  # the legs that found it: "vector", "lexical"
