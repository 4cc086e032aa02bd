"""One hit of conversation.search: what the search answers of a turn (its module,
loom.ops.conversation.reading.searching, and the re-ranker, search_rerank, share it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Hit:
    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    role: str
    run_id: str
    user_id: str
    ts: datetime
    similarity: float | None
    excerpt: str
    score: float | None = None  # the mode's own score (module docstring); None for substring hits
    legs: tuple[str, ...] = ()  # the legs that found it: "vector", "lexical"
