"""Request and response of conversation.search."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from loom.api.models.common import Namespace, RequestBody, Timestamp
from loom.api.models.conversation import AgentOrAll, ShortText, ThreadId
from loom.limits import MAX_QUERY_CHARS
from loom.limits import MAX_SEARCH_LIMIT as MAX_LIMIT

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


class SearchHit(BaseModel):
    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    role: str
    run_id: str
    user_id: str
    ts: Timestamp
    similarity: float | None = Field(description="Cosine similarity to the query; null for substring hits.")
    excerpt: str = Field(
        description="The turn's first LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS characters; read the "
        "whole turn with conversation.get or conversation.list."
    )


class SearchResponse(BaseModel):
    mode: Literal["vector", "substring"]
    fallback_reason: str | None = Field(
        description='Why the search ran by substring: "embedder_timeout", "embedder_error" (the embedder is '
        'unavailable) or "query_high_sensitivity" (the query itself reads as high and is never '
        "embedded); null in vector mode."
    )
    namespaces: list[str] = Field(
        description="The namespaces searched: the one named, or every namespace the token grants."
    )
    hits: list[SearchHit]
