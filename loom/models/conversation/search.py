"""Request and response of conversation.search."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field

from loom.limits import DEFAULT_LEXICAL_WEIGHT, MAX_LEXICAL_WEIGHT, MAX_QUERY_CHARS, MIN_LEXICAL_WEIGHT
from loom.limits import MAX_SEARCH_LIMIT as MAX_LIMIT
from loom.models.common import Namespace, RequestBody, Timestamp
from loom.models.conversation.reading import AgentOrAll, ShortText, ThreadId

Query = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        description="What to look for, in words (embedded unless it reads as high).",
    ),
]


class SearchRequest(RequestBody):
    namespace_scope: Literal["all_mine", "one"] | None = Field(
        None,
        description='"all_mine": every namespace the token grants; "one": only `namespace`. Left out: '
        '"one" when `namespace` is given, else "all_mine".',
    )
    namespace: Namespace | None = Field(
        None,
        description='Search only this namespace. Required with namespace_scope "one"; given with "all_mine" '
        "it is a 422 naming both fields.",
    )
    query: Query
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    thread_id: ThreadId | None = Field(None, description="Only this thread's turns.")
    run_id: ShortText | None = Field(None, description="Only this run's turns.")
    role: Literal["user", "assistant", "system"] | None = Field(
        None, description='Only turns of this role; "system" finds compaction summaries.'
    )
    agent: AgentOrAll | None = Field(
        None, description='Only this agent\'s turns; omitted or "*": every agent.'
    )
    search_mode: Literal["vector", "hybrid", "lexical"] = Field(
        "vector",
        description='"vector": cosine similarity to the query\'s embedding, hits under '
        'LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY dropped (the default); "lexical": BM25 over the turns\' whole '
        'text (stop-words dropped from the query, terms stemmed), no floor; "hybrid": both, fused by '
        "reciprocal rank, the floor applying to the vector leg only (a lexical hit enters without it).",
    )
    lexical_weight: float = Field(
        DEFAULT_LEXICAL_WEIGHT,
        ge=MIN_LEXICAL_WEIGHT,
        le=MAX_LEXICAL_WEIGHT,
        description="The lexical (BM25) leg's share of the fusion in hybrid mode, the vector leg taking "
        f"the rest ({MIN_LEXICAL_WEIGHT:g} to {MAX_LEXICAL_WEIGHT:g}: 0 the vector leg alone, 1 the lexical "
        "leg alone).",
    )

    time_phrases: Literal["filter", "ignore"] = Field(
        "filter",
        description='"filter": a time phrase of the query ("last week", "in May", "in 2024", "before 3 March '
        '2024", "before the move": until the time of the turn the words "the move" find best) keeps the '
        "hits to that window of the turns' time, and the search answers without it when the window holds "
        'no hit (`time_window` says which); "ignore": the words only rank. A question asking for a time '
        '("when did ...") sets no window.',
    )
    rerank: bool = Field(
        False,
        description="Re-order the best candidates with the configured LLM (the namespace must allow model "
        "calls; a turn that reads as high is never sent). Without an LLM the hits come as ranked, and "
        "`rerank` in the answer says why not.",
    )


class TimeWindowOut(BaseModel):
    phrase: str = Field(description="The words of the query that set the window.")
    since: Timestamp | None = Field(description="Turns at or after this time (null: open).")
    until: Timestamp | None = Field(description="Turns before this time (null: open).")
    applied: bool = Field(description="False when the window held no hit and the search answered without it.")


class SearchHit(BaseModel):
    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    role: str
    run_id: str
    user_id: str
    ts: Timestamp
    similarity: float | None = Field(
        description="Cosine similarity to the query where the vector leg found the turn; null for substring "
        "hits and for hits of the lexical leg alone."
    )
    score: float | None = Field(
        None,
        description="The mode's score: the similarity (vector), BM25 (lexical), the fused reciprocal-rank score "
        "(hybrid); null for substring hits.",
    )
    legs: list[Literal["vector", "lexical"]] = Field(
        default_factory=list, description="The legs that found the turn (empty for substring hits)."
    )
    excerpt: str = Field(
        description="The turn's first LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS characters; read the "
        "whole turn with conversation.get or conversation.list."
    )


class SearchResponse(BaseModel):
    mode: Literal["vector", "hybrid", "lexical", "substring"] = Field(
        description="The mode that answered: the one asked, or the fallback (vector mode falls back to "
        "substring, hybrid to lexical)."
    )
    fallback_reason: str | None = Field(
        description='Why the search fell back: "embedder_timeout", "embedder_error" (the embedder is '
        'unavailable) or "query_high_sensitivity" (the query itself reads as high and is never '
        "embedded); null otherwise."
    )
    namespaces: list[str] = Field(
        description="The namespaces searched: the one named, or every namespace the token grants."
    )
    hits: list[SearchHit]
    embedding_model: str | None = Field(
        None,
        description="The model whose vectors the vector leg compared the query with (only vectors of the "
        "query's own model are ever compared: a namespace being re-embedded with another model answers "
        "from this one's); null when no vector leg ran.",
        validation_alias=AliasChoices("embedding_model", "model"),  # `model` on the search's result
    )
    rerank: str | None = Field(
        None,
        description='With `rerank: true`: "reranked", or why the hits kept the search\'s order: '
        '"llm_not_configured", "model_calls_disabled", "query_high_sensitivity", "llm_failed", '
        '"nothing_to_rerank"; null when not asked.',
    )
    time_window: TimeWindowOut | None = Field(
        None, description="The query's time phrase and the window it set (see `time_phrases`); null: none."
    )
