"""Requests and responses of the saved-message ops."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from loom.limits import MAX_LEXICAL_WEIGHT, MIN_LEXICAL_WEIGHT, SAVED_LEXICAL_WEIGHT
from loom.models.bounds import JsonObject
from loom.models.common import AgentId, NamespacedRequest, Timestamp
from loom.models.conversation.reading import Content, MsgId, RoleName, ShortText, ThreadId

UserId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        description="The user whose saved messages these are. Required, except with a token "
        "pinned to one user (--read-scope own_user), which acts as its user: "
        "leave it out or name that user.",
    ),
]
ConversationId = Annotated[ThreadId, Field(description="The conversation (thread_id) of the message.")]
MessageId = Annotated[MsgId, Field(description="The message's id (msg_id) in its conversation.")]
SaveReason = Literal["owner_mismatch", "deleted", "unsupported_role", "high_sensitivity", "embed_failed"]
SearchMode = Literal["hybrid", "semantic", "lexical"]


class SavedRequest(NamespacedRequest):
    user_id: UserId | None = None


class SaveRequest(SavedRequest):
    """Save one message for the user. A message the transcript holds (this agent's copy)
    is flagged in place; one it does not hold needs `role` and `content`, and is stored."""

    conversation_id: ConversationId
    message_id: MessageId
    agent: AgentId = "default"
    role: RoleName | None = Field(None, description="For a message not in the transcript yet.")
    content: Content | None = Field(None, description="For a message not in the transcript yet.")
    run_id: ShortText = ""
    metadata: JsonObject = Field(default_factory=dict)
    ts: datetime | None = Field(None, description="The message time of a new message (default: now).")

    @field_validator("content")
    @classmethod
    def _not_blank(cls, content: str | None) -> str | None:
        if content is not None and not content.strip():
            raise ValueError("content must not be blank")
        return content


class SaveResponse(BaseModel):
    conversation_id: str
    message_id: str
    saved: bool = Field(description="Whether the message is saved for this user now.")
    indexed: bool = Field(
        description="Whether it is in the vector leg of the search (the lexical leg needs no embedding)."
    )
    reason: SaveReason | None = Field(
        None,
        description="owner_mismatch: another user owns the message; deleted: it was deleted; "
        "unsupported_role: a system or tool turn (never embedded); high_sensitivity: it reads as "
        "high (a new one is not stored, an existing one is not embedded); embed_failed: stored "
        "and saved, but the embed failed (saving again retries it).",
    )
    saved_at: Timestamp | None = Field(None, description="When the user saved it.")


class UnsaveRequest(SavedRequest):
    conversation_id: ConversationId
    message_id: MessageId
    agent: AgentId = "default"


class UnsaveResponse(BaseModel):
    found: bool = Field(
        description="False when this user has no such saved message (never saved, or saved by "
        "another user: the answer does not say which)."
    )
    removed: bool = Field(
        description="True when the message was removed: a save alone had stored it (it was "
        "never recorded), so it existed only because of the save. A recorded "
        "message stays in the transcript with the flag cleared."
    )


class ListSavedRequest(SavedRequest):
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, max_length=4096, description="next_cursor of the previous page.")
    conversation_id: ConversationId | None = Field(
        None, description="Only this conversation's saved messages."
    )


class SavedMessageOut(BaseModel):
    conversation_id: str
    message_id: str
    role: str
    ts: Timestamp = Field(
        description="When the user saved it (the message time where no save time was recorded)."
    )
    excerpt: str = Field(description="The start of the message; empty when it reads as high.")
    agent: str = Field(description="The agent whose copy of the message is saved (unsave names it).")


class ListSavedResponse(BaseModel):
    messages: list[SavedMessageOut]
    next_cursor: str | None = None


class SavedStatusRequest(SavedRequest):
    conversation_id: ConversationId
    message_ids: list[MessageId] = Field(min_length=1, max_length=500)


class SavedStatusResponse(BaseModel):
    saved: dict[str, bool]


class SearchSavedRequest(SavedRequest):
    query: Annotated[str, Field(min_length=1, max_length=4_000)]
    limit: int = Field(10, ge=1, le=100)
    search_mode: SearchMode = "hybrid"
    lexical_weight: float = Field(
        SAVED_LEXICAL_WEIGHT,
        ge=MIN_LEXICAL_WEIGHT,
        le=MAX_LEXICAL_WEIGHT,
        description="The lexical (BM25) leg's share of the fusion in hybrid mode, the vector leg taking "
        f"the rest ({MIN_LEXICAL_WEIGHT:g} to {MAX_LEXICAL_WEIGHT:g}: 0 the vector leg alone, 1 the lexical "
        "leg alone).",
    )
    conversation_id: ConversationId | None = Field(
        None, description="Only this conversation's saved messages."
    )

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, query: str) -> str:
        if not query.strip():
            raise ValueError("query must not be blank")
        return query


class SavedHitOut(BaseModel):
    conversation_id: str
    message_id: str
    role: str
    ts: Timestamp = Field(description="The message time.")
    saved_at: Timestamp | None
    score: float = Field(
        description="hybrid: the fused reciprocal-rank score; semantic: cosine similarity; "
        "lexical: the BM25 score."
    )
    excerpt: str = Field(description="Centred on the matched terms for a lexical hit, else the start.")
    legs: list[Literal["vector", "lexical"]] = Field(description="The legs that found it.")
    agent: str = Field(description="The agent whose copy of the message is saved (unsave names it).")


class SearchSavedResponse(BaseModel):
    search_mode: SearchMode = Field(
        description="The mode that answered: lexical when the vector leg fell back."
    )
    hits: list[SavedHitOut]
    fallback_reason: str | None = Field(
        None,
        description="Why the vector leg did not run (the embedder failed, or "
        "the query reads as high and is never sent to it).",
    )
