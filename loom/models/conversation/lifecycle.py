"""Requests and responses of conversation.compact and conversation.compact_status."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from loom.models.common import AgentId, NamespacedRequest
from loom.models.conversation.reading import ThreadId


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
