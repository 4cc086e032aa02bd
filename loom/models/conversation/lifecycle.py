"""Requests and responses of the ops on a thread's life: conversation.compact and
compact_status, delete, delete_message, redact and set_logging."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from loom.models.common import AgentId, NamespacedRequest, Timestamp
from loom.models.conversation.reading import MsgId, ThreadId


class CompactRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    keep_recent: int = Field(10, ge=0, le=100_000, description="The newest turns left as they are.")
    min_to_compact: int = Field(
        4, ge=1, le=100_000, description="Fewer new turns than this in the window: nothing is compacted."
    )
    defer: bool = Field(
        False, description="Answer the job id at once; poll it with conversation.compact_status."
    )


class CompactResponse(BaseModel):
    thread_id: str
    agent: str
    messages_summarized: int = Field(
        0, description="Turns the summary replaced (earlier summaries not counted)."
    )
    summary_msg_id: str | None = Field(
        None, description="The summary's msg_id; null when nothing was compacted."
    )
    reason: str | None = Field(
        None,
        description="Why nothing was compacted: nothing-to-compact, below-min-to-compact, embed-failed, "
        "summary-high-sensitivity, summarizer-failed, window-changed.",
    )
    retry: bool | None = Field(None, description="With a reason: whether a retry may do better.")
    note: str | None = None
    summaries_replaced: int = Field(0, description="Earlier summaries the new one replaced.")
    tokens_in: int = Field(
        0,
        description="The summarizer's prompt tokens (as its provider counted them, "
        "else estimated at 4 characters a token).",
    )
    tokens_out: int = 0
    job_id: str | None = Field(None, description="The worker pool's job (with defer: poll it).")


class CompactStatusRequest(NamespacedRequest):
    job_id: str = Field(min_length=1, max_length=128)


class CompactStatusResponse(BaseModel):
    job_id: str
    state: Literal["queued", "in_progress", "complete", "not_found"]
    result: CompactResponse | None = None


class SetLoggingRequest(NamespacedRequest):
    enabled: bool


class DeleteRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    confirm_thread_id: str = Field(max_length=256, description="Must repeat thread_id exactly (else 422).")


class DeleteResponse(BaseModel):
    thread_id: str
    agent: str
    deleted: bool
    turns_tombstoned: int
    thread_tombstoned: bool
    embeddings_tombstoned: int
    embeddings_handed_over: int


class DeleteMessageRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId


class TableCountOut(BaseModel):
    written: int = Field(description="New row versions written (tombstones, rewritten texts, hand-overs).")
    removed: int = Field(
        description="Older row versions on disk when the op ran, that it removes (or the engine's "
        "merge of the new version removed first)."
    )


class RemovalReceipt(BaseModel):
    """What a removal of one turn did; never any removed text."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    found: bool = Field(description="False when nothing was left to remove (asked again).")
    tables: dict[str, TableCountOut]
    embedding: str = Field(
        description="What became of the turn's embedding row: none, tombstoned, handed_over, "
        "kept_by_other_agent, embedded or failed."
    )
    summaries_tombstoned: int = Field(description="Compaction summaries built from the turn, tombstoned.")
    turns_restored: int = Field(description="Turns those summaries had replaced, live again.")
    at: Timestamp | None = None
    by: str = Field(description="The token id that asked.")
    unreadable_ms: float = Field(description="From the op's start until no read found the old text.")
    gone_ms: float = Field(description="From the op's start until no part file held it (0: not yet).")
    removal: str = Field(
        description="done: the older versions left the disk before the answer; pending: their removal "
        "was submitted (durable) and the engine finishes it."
    )


class DeleteMessageResponse(RemovalReceipt):
    deleted: bool = Field(description="The transcript row is gone (for an end-user token: a saved-only row).")
    unsaved: bool = Field(
        False,
        description="An end-user token's delete withdrew its own saved message, as "
        "conversation.unsave_message does; a recorded turn stays in the transcript.",
    )


class RedactRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId
    spans: list[Annotated[str, Field(min_length=1, max_length=100_000)]] | None = Field(
        None, max_length=100, description="Exact texts to replace (every occurrence)."
    )
    ranges: list[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]] | None = Field(
        None, max_length=100, description="[start, end) character ranges of the turn's text to replace."
    )
    high: bool = Field(False, description="Replace every span that reads as high.")
    placeholder: str = Field(
        "[redacted]", min_length=1, max_length=64, description="What replaces each span."
    )


class RedactResponse(RemovalReceipt):
    redacted: bool
    placeholder: str
    spans: int = Field(description="How many (merged) spans were replaced.")
    high_sensitivity: bool = Field(description="The turn still reads as high (then it has no embedding).")
