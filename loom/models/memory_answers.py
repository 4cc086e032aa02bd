"""Requests and responses of memory.ask and memory.job_status."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from loom.models.common import NamespacedRequest, Timestamp
from loom.models.memory import EvidenceOut, FactHitOut, ScopedRequest


class MemoryAskRequest(ScopedRequest):
    question: Annotated[str, Field(min_length=1, max_length=2_000)]
    as_of: datetime | None = Field(
        None, description="Ask about this time: facts valid then, evidence said by then (RFC 3339)."
    )
    limit: int = Field(10, ge=1, le=50, description="Facts and evidence messages each, at most.")


class CitationOut(BaseModel):
    kind: Literal["fact", "evidence"]
    id: str = Field(description="The fact's memory_id or the evidence's evidence_id.")
    time: Timestamp = Field(description="The fact's last update, or when the evidence was said.")


class TimeBasisOut(BaseModel):
    newest: Timestamp | None = Field(
        None,
        description="The newest time among the cited items (among the context when none is cited): "
        "what the answer knows up to.",
    )
    as_of: Timestamp | None = None


class ProfileSectionOut(BaseModel):
    name: str
    text: str


class MemoryAskResponse(BaseModel):
    answer: str | None = Field(description="null when no model answered (see reason).")
    reason: (
        Literal[
            "llm_not_configured",
            "question_high_sensitivity",
            "model_calls_disabled",
            "no_context",
            "llm_failed",
            "answer_high_sensitivity",
        ]
        | None
    ) = None
    citations: list[CitationOut]
    time_basis: TimeBasisOut
    facts: list[FactHitOut] = Field(
        description="The ranked facts the model was given (memory.search's ranking)."
    )
    evidence: list[EvidenceOut] = Field(
        description="The ranked evidence it was given (memory.recall's BM25)."
    )
    profile: list[ProfileSectionOut] = Field(default_factory=list)
    fallback_reason: str | None = Field(
        None, description="Why the facts' vector leg did not run, if it did not."
    )


class JobStatusRequest(NamespacedRequest):
    job_id: str = Field(min_length=1, max_length=64)


class JobCountsOut(BaseModel):
    extracted: int
    added: int
    updated: int
    deleted: int
    left: int


class JobStatusResponse(BaseModel):
    job_id: str
    state: Literal["queued", "running", "done", "failed"]
    user_id: str
    session_id: str = ""
    run_id: str = ""
    queued_at: Timestamp | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    attempts: int = 0
    extraction_id: str | None = None
    counts: JobCountsOut | None = Field(None, description="Once done.")
    reason: str | None = Field(
        None,
        description="done: nothing_readable or subject_erased when nothing was extracted; failed: "
        "llm_not_configured, llm_failed, backend_unavailable or internal_error.",
    )
