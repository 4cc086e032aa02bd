"""The route of conversation.search. Like every conversation op it refuses tokens bound
to one user or session (a thread mixes users and has no user axis to bound)."""

from __future__ import annotations

from fastapi import Response

from loom.api.deps import Caller, Svc, op_router
from loom.models.conversation.search import SearchRequest, SearchResponse
from loom.ops.conversation.reading import searching
from loom.ops.conversation.reading.threads import ALL_AGENTS
from loom.store.search import Filters

router = op_router("conversation")

PLAN_HEADER = "x-loom-search-plan"


@router.post("/conversation.search", response_model=SearchResponse)
async def search(body: SearchRequest, response: Response, who: Caller, svc: Svc) -> SearchResponse:
    """Vector search over the embedded turns (user and assistant turns, compaction
    summaries) of one namespace (`namespace`), or of every namespace the token grants
    when the body names none (`namespace_scope: "all_mine"`, the default). The answer's
    `namespaces` lists the namespaces searched.

    Hits are ranked by cosine similarity; those below LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY
    (0.30) are dropped. Each shows the first LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS (240)
    characters of its turn. When the embedder is unavailable, the search answers by a
    case-insensitive substring match (`mode: "substring"`, `fallback_reason` says why,
    `similarity` is null), as it does for a query that reads as high, which is never
    embedded. Turns that read as high, and deleted turns, are never returned.

    `search_mode` "lexical" ranks by BM25 over the turns' whole text (no floor); "hybrid"
    fuses both legs by reciprocal rank (`lexical_weight` scales the lexical leg; the floor
    applies to the vector leg only) and falls back to the lexical leg alone when the query
    cannot be embedded. Each hit names the legs that found it.
    """
    agent = None if body.agent in (None, ALL_AGENTS) else body.agent
    result = await searching.search(
        svc,
        who,
        body.query,
        namespace_scope=body.namespace_scope,
        namespace=body.namespace,
        limit=body.limit,
        filters=Filters(thread_id=body.thread_id, run_id=body.run_id, role=body.role, agent=agent),
        search_mode=body.search_mode,
        lexical_weight=body.lexical_weight,
        time_phrases=body.time_phrases,
        rerank=body.rerank,
    )
    response.headers[PLAN_HEADER] = ",".join(result.plan)
    return SearchResponse.model_validate(result, from_attributes=True)
