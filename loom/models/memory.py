"""Requests and responses of the memory plane (memory.*)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from loom.models.common import NamespacedRequest, StrictModel, Timestamp
from loom.models.conversation.reading import Content, MsgId, RoleName, ShortText

UserId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        description="Whose memory. Required, except with a token pinned to one user, which "
        "acts as its user: leave it out or name that user.",
    ),
]
FactText = Annotated[str, Field(min_length=1, max_length=2_000)]
Kind = Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.:-]*$")]
Key = Annotated[str, Field(max_length=256)]
Source = Literal["set", "extraction", "crystallize"]


class ScopedRequest(NamespacedRequest):
    user_id: UserId | None = None
    session_id: ShortText = ""
    run_id: ShortText = ""


AsOf = Annotated[
    datetime | None,
    Field(
        description="Answer the facts valid at this time (superseded ones included) instead of "
        "the current facts (valid now and not superseded)."
    ),
]


class FactIn(StrictModel):
    text: FactText
    kind: Kind = ""
    key: Key = Field(
        "",
        description="A key names one chain of facts: the same text again revises its current fact; "
        "a different text supersedes it (a new memory_id; the old one keeps its text, closed).",
    )
    valid_from: datetime | None = Field(
        None, description="When it became true (default: a time stated in the text, else now)."
    )
    valid_until: datetime | None = Field(
        None, description="When it stops being true (default: a time stated in the text, else open)."
    )


class MemorySetRequest(ScopedRequest):
    facts: list[FactIn] = Field(min_length=1, max_length=100)


class SetResult(BaseModel):
    memory_id: str | None
    stored: bool
    updated: bool = Field(description="The key named a live fact, which this revised or superseded.")
    supersedes: str | None = Field(None, description="The key's fact this one superseded (a different text).")
    indexed: bool = Field(description="In the vector leg of memory.search (BM25 needs no embedding).")
    reason: Literal["high_sensitivity", "embed_failed", "subject_erased"] | None = Field(
        None,
        description="high_sensitivity: the text reads as high and was not stored; embed_failed: stored, "
        "found by BM25 only (the error is on its row); subject_erased: an erasure of the user ran "
        "meanwhile and the fact was not kept.",
    )


class MemorySetResponse(BaseModel):
    results: list[SetResult]


class FactOut(BaseModel):
    memory_id: str
    text: str
    kind: str
    key: str
    session_id: str
    run_id: str
    source: Source
    evidence_ids: list[str] = Field(
        description="The evidence an extraction decided from (memory.recall reads it)."
    )
    created_at: Timestamp
    updated_at: Timestamp
    valid_from: Timestamp = Field(description="When it became true.")
    valid_until: Timestamp | None = Field(description="When it stopped being true (null: it holds).")
    supersedes: str | None = Field(description="The fact this one replaced.")
    superseded_by: str | None = Field(description="The fact that replaced this one.")


class MemorySearchRequest(ScopedRequest):
    query: Annotated[str, Field(min_length=1, max_length=4_000)]
    limit: int = Field(10, ge=1, le=100)
    as_of: AsOf = None
    time_phrases: Literal["filter", "ignore"] = Field(
        "filter",
        description='"filter": a time phrase of the query bounds the facts\' validity: a window with an end '
        '("in May 2025", "last week", "before 3 March 2024") reads the facts as they stood just before it '
        'ends (never later than now), a window with a start only ("since March", "in the last two weeks") '
        "keeps the current facts that became true at or after it; the search answers without it when the "
        'window holds no fact (`time_window` says which). "ignore": the words only rank. A question asking '
        'for a time ("when did ...") and an event ("before the move") set no window; `as_of` wins over the '
        "words.",
    )


class FactHitOut(FactOut):
    score: float = Field(description="Reciprocal-rank fusion of the legs that found it (k=60).")
    legs: list[Literal["vector", "lexical"]]
    similarity: float | None = None
    bm25: float | None = None


class FactWindowOut(BaseModel):
    phrase: str = Field(description="The words of the query that set the window.")
    as_of: Timestamp | None = Field(description="The facts were read as they stood at this time (null: now).")
    since: Timestamp | None = Field(description="Only facts valid from this time or later (null: any).")
    applied: bool = Field(
        description="False when the window held no fact and the search answered without it."
    )


class MemorySearchResponse(BaseModel):
    hits: list[FactHitOut]
    fallback_reason: str | None = Field(None, description="Why the vector leg did not run, if it did not.")
    time_window: FactWindowOut | None = Field(
        None, description="The query's time phrase and what it did (see `time_phrases`); null: none."
    )


class MemoryListRequest(ScopedRequest):
    kind: Kind | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: Annotated[str, Field(max_length=2_000)] | None = None
    as_of: AsOf = None


class MemoryListResponse(BaseModel):
    facts: list[FactOut]
    next_cursor: str | None = None


class MemoryDeleteRequest(NamespacedRequest):
    user_id: UserId | None = None
    memory_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1, max_length=500)


class MemoryDeleteResponse(BaseModel):
    deleted: list[str] = Field(description="The ids that were live and are forgotten now.")
    forgotten: list[str] = Field(
        default_factory=list,
        description="Every version forgotten with them: the whole chain of each (history included).",
    )


class MemoryHistoryRequest(NamespacedRequest):
    user_id: UserId | None = None
    memory_id: Annotated[str, Field(min_length=1, max_length=64)]


class FactVersionOut(FactOut):
    current: bool = Field(description="Valid now and not superseded.")


class MemoryHistoryResponse(BaseModel):
    memory_id: str
    chain: list[FactVersionOut] = Field(description="The fact's versions, oldest to newest.")


class MemoryProfileRequest(NamespacedRequest):
    user_id: UserId | None = None


class ProfileSectionOut(BaseModel):
    name: str = Field(description="identity, preferences, work, relationships, other; or a fact kind.")
    text: str


class MemoryProfileResponse(BaseModel):
    sections: list[ProfileSectionOut]
    basis: Literal["llm", "facts"] = Field(
        description="llm: the model summarised the facts; facts: built from the current facts grouped "
        "by kind, no model (see reason)."
    )
    reason: str | None = Field(
        None,
        description="Why the basis is facts: llm_not_configured, llm_failed, no_facts, session_scope "
        "(a token pinned to one session: that session's facts, not stored), subject_erased.",
    )
    fact_ids: list[str] = Field(description="The current facts it was built from.")
    dropped: int = Field(description="Sections the model wrote that read as high (never kept).")
    built_at: Timestamp
    rebuilt: bool = Field(description="Built for this answer (the stored one was stale or missing).")


class MessageIn(StrictModel):
    role: RoleName
    content: Content
    msg_id: MsgId | None = None
    ts: datetime | None = Field(
        None, description="When it was said (default: now); memory.recall's window uses it."
    )


class SetFromMessagesRequest(ScopedRequest):
    messages: list[MessageIn] = Field(min_length=1, max_length=500)
    defer: bool = Field(False, description="Store the evidence, extract on the worker pool, answer a job id.")


class DecisionOut(BaseModel):
    action: Literal["add", "update", "delete", "leave"]
    memory_id: str = Field(description="For an update, the new fact (it supersedes the old one).")
    text: str
    supersedes: str | None = Field(None, description="An update's old fact (kept, closed).")


class SetFromMessagesResponse(BaseModel):
    evidence_ids: list[str]
    extracted: int = Field(description="Facts the model proposed (none that read as high).")
    decisions: list[DecisionOut]
    reason: (
        Literal["llm_not_configured", "llm_failed", "nothing_readable", "deferred", "subject_erased"] | None
    ) = Field(
        None,
        description="llm_not_configured: no model (the evidence is stored, no fact extracted); llm_failed: "
        "the model failed or answered no JSON; nothing_readable: every message reads as high; "
        "deferred: extraction runs on the worker pool (job_id); subject_erased: an erasure of the user "
        "ran meanwhile and nothing of this call was kept.",
    )
    job_id: str | None = None
    extraction_id: str | None = None


class RecallRequest(ScopedRequest):
    query: Annotated[str, Field(max_length=4_000)] = ""
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(10, ge=1, le=100)


class EvidenceOut(BaseModel):
    evidence_id: str
    msg_id: str
    role: str
    content: str
    source: Literal["messages", "observation"]
    session_id: str
    run_id: str
    ts: Timestamp
    score: float | None = None
    matched: list[str] = Field(default_factory=list)


class RecallResponse(BaseModel):
    hits: list[EvidenceOut]


class ObserveRecordRequest(ScopedRequest):
    run_id: Annotated[str, Field(min_length=1, max_length=256)]
    tool: Annotated[str, Field(min_length=1, max_length=256)]
    input_summary: Annotated[str, Field(max_length=8_000)] = ""
    outcome: Annotated[str, Field(max_length=8_000)] = ""
    obs_id: MsgId | None = Field(
        None, description="Makes the record idempotent (default: a hash of its text)."
    )
    ts: datetime | None = None


class ObserveRecordResponse(BaseModel):
    evidence_id: str


class ObserveCrystallizeRequest(NamespacedRequest):
    user_id: UserId | None = None
    run_id: Annotated[str, Field(min_length=1, max_length=256)]


class ContextPackRequest(NamespacedRequest):
    user_id: UserId | None = None
    session_id: ShortText = ""
    thread_id: ShortText = Field(
        "", description="The thread whose transcript tail to include (when recorded)."
    )
    agent: Annotated[str, Field(min_length=1, max_length=128)] = "default"
    query: Annotated[str, Field(max_length=4_000)] = ""
    token_budget: int = Field(4000, ge=64, le=64_000)
    brief_key: Annotated[str, Field(max_length=200)] = Field(
        "", description="A brief to include; without it no brief is loaded."
    )
    include_profile: bool = Field(
        False, description="Include the user's profile (a section per item, within the budget)."
    )


class PackItemOut(BaseModel):
    text: str
    source: str = Field(
        description="memory:<memory_id>, turn:<msg_id>, evidence:<evidence_id>, brief:<key> or "
        "profile:<section>."
    )
    ts: Timestamp | None = None


class PackSectionOut(BaseModel):
    name: Literal["brief", "profile", "facts", "transcript", "evidence"]
    items: list[PackItemOut]
    tokens: int
    note: str | None = Field(None, description="Why a section is empty: no_thread, not_recorded, empty.")


class ContextPackResponse(BaseModel):
    sections: list[PackSectionOut]
    token_budget: int
    tokens_used: int


class UnifiedSearchRequest(NamespacedRequest):
    query: Annotated[str, Field(min_length=1, max_length=4_000)]
    user_id: UserId | None = Field(None, description="Whose memory to search (memory is per user).")
    limit: int = Field(10, ge=1, le=50)


class ConversationHitOut(BaseModel):
    agent: str
    thread_id: str
    msg_id: str
    role: str
    ts: Timestamp
    similarity: float | None
    excerpt: str


class MemorySectionOut(BaseModel):
    hits: list[FactHitOut]
    note: str | None = Field(None, description="no_user (name user_id), or why the vector leg did not run.")


class ConversationSectionOut(BaseModel):
    hits: list[ConversationHitOut]
    note: str | None = Field(
        None, description="not_permitted for a token pinned to one user, or a fallback reason."
    )


class UnifiedSearchResponse(BaseModel):
    memory: MemorySectionOut
    conversation: ConversationSectionOut
