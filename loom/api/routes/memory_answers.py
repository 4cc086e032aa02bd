"""Routes of memory.ask and memory.job_status (viewer; a token pinned to one user acts
for that user only)."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.api.routes.memory import evidence_out, fact_hit_out
from loom.models import memory_answers as ma
from loom.models.errors import error_responses
from loom.ops.memory import asking, job_status

router = op_router("memory")


@router.post("/memory.ask", response_model=ma.MemoryAskResponse)
async def memory_ask(
    body: ma.MemoryAskRequest,
    who: Caller,
    svc: Svc,
) -> ma.MemoryAskResponse:
    """A plain-language question about the user, answered by the LLM from the user's facts,
    profile and evidence, with citations and the time basis. With no model configured (or a
    question that reads as high) it answers the ranked context, `answer: null` and a `reason`."""
    out = await asking.ask(svc, who, body)
    return ma.MemoryAskResponse.model_validate(
        {
            "answer": out.answer,
            "reason": out.reason,
            "citations": [ma.CitationOut(kind=c.kind, id=c.id, time=c.time) for c in out.citations],
            "time_basis": ma.TimeBasisOut(newest=out.newest, as_of=out.as_of),
            "facts": [fact_hit_out(h) for h in out.facts],
            "evidence": [evidence_out(e) for e in out.evidence],
            "profile": [ma.ProfileSectionOut(name=n, text=t) for n, t in out.profile],
            "fallback_reason": out.fallback_reason,
        }
    )


@router.post("/memory.job_status", response_model=ma.JobStatusResponse, responses=error_responses(404))
async def memory_job_status(
    body: ma.JobStatusRequest,
    who: Caller,
    svc: Svc,
) -> ma.JobStatusResponse:
    """The state of a deferred extraction (memory.set_from_messages with defer): queued,
    running, done (with counts) or failed (with a stable reason). A job of another
    namespace, or of another user for a token pinned to one, is 404."""
    status = await job_status.job_status(svc, who, body.namespace, body.job_id)
    return ma.JobStatusResponse.model_validate(asdict(status))
