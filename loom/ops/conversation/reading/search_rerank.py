"""conversation.search's optional re-ranking (``rerank: true``) by the configured LLM.

No cross-encoder ships inside a package this project can install (every re-ranker
package found downloads its weights at run time), so the re-ranker is the chat model
the deployment configured (LOOM_LLM), and only where the namespace allows model calls.
The search gathers a deeper pool (RERANK_DEPTH hits), the model orders it
(prompts/rerank_system.txt: the question and each hit's excerpt under a short id, never
Loom's ids), and the page is cut from that order.

What reaches the model: the query and the excerpts of hits that search already
screened (a turn that reads as high is never a hit), each screened again here; a
query that reads as high is never sent. Hits of a namespace whose owner switched model
calls off are never sent either: they keep their places, and the others are re-ordered
around them. Any failure (no model, a refused or malformed answer) leaves the order as
it was, and ``status`` says why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from loom import failures
from loom import logging as loom_logging
from loom.ops.conversation.reading.hits import Hit
from loom.providers.llm import ChatMessage, LLMError, json_object
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import namespaces as ns_store

log = loom_logging.get("loom.conversation.search.rerank")
_PROMPT = Path(__file__).parent / "prompts" / "rerank_system.txt"

RERANK_DEPTH = 50  # hits gathered for the model to order (why 50, not 20: docs/search.md)
EXCERPT_CHARS = 400  # of each hit's excerpt in the prompt (50 of them: about 5,000 tokens)

RERANKED = "reranked"
NOT_CONFIGURED = "llm_not_configured"
CALLS_DISABLED = "model_calls_disabled"
QUERY_HIGH = "query_high_sensitivity"
FAILED = "llm_failed"
NOTHING = "nothing_to_rerank"


async def rerank(svc: Services, query: str, hits: Sequence[Hit]) -> tuple[list[Hit], str]:
    """The hits in the model's order, and the status (RERANKED, or why they kept theirs)."""
    kept = list(hits)
    if reads_as_high(query):
        return kept, QUERY_HIGH
    if not svc.llm.configured:
        return kept, NOT_CONFIGURED
    allowed = await _allowed(svc, {h.namespace for h in hits})
    movable = [i for i, h in enumerate(kept) if h.namespace in allowed and not reads_as_high(h.excerpt)]
    if len(movable) < 2:
        return kept, CALLS_DISABLED if hits and not allowed else NOTHING
    try:
        order = await _ask(svc, query, [kept[i] for i in movable])
    except (LLMError, ValueError) as exc:
        log.warning("conversation.search re-rank failed", error=failures.detail(exc))
        return kept, FAILED
    reordered = [kept[movable[j]] for j in order]
    for slot, hit in zip(movable, reordered, strict=True):
        kept[slot] = hit
    return kept, RERANKED


async def _allowed(svc: Services, namespaces: set[str]) -> set[str]:
    configs = await svc.run(ns_store.get_many, svc.ch, sorted(namespaces))
    return {ns for ns, config in configs.items() if config.model_calls_enabled}


async def _ask(svc: Services, query: str, hits: list[Hit]) -> list[int]:
    """The model's order of `hits` (indexes); ids it left out follow in their order,
    ids it made up are dropped."""
    turns = [
        {"id": f"T{i + 1}", "role": h.role, "time": h.ts.isoformat(), "text": h.excerpt[:EXCERPT_CHARS]}
        for i, h in enumerate(hits)
    ]
    user = json.dumps({"question": query, "turns": turns}, ensure_ascii=False)
    reply = await svc.llm.complete(
        [ChatMessage("system", _PROMPT.read_text()), ChatMessage("user", user)], temperature=0.0
    )
    ranking = json_object(reply).get("ranking")
    if not isinstance(ranking, list):
        raise ValueError("the model's reply holds no ranking list")
    order: list[int] = []
    for item in ranking:
        text = str(item)
        j = int(text[1:]) - 1 if text.startswith("T") and text[1:].isdigit() else -1
        if 0 <= j < len(hits) and j not in order:
            order.append(j)
    return order + [j for j in range(len(hits)) if j not in order]
