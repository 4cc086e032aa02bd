"""Routes of conversation.compact and conversation.compact_status (writer)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from loom.api.deps import Caller, Svc
from loom.models.conversation.lifecycle import (
    CompactRequest,
    CompactResponse,
    CompactStatusRequest,
    CompactStatusResponse,
)
from loom.models.errors import COMMON, error_responses
from loom.ops.conversation.lifecycle import compacting

router = APIRouter(prefix="/v1", tags=["conversation"], responses=error_responses(*COMMON))


@router.post("/conversation.compact", response_model=CompactResponse, responses=error_responses(409))
async def compact(body: CompactRequest, who: Caller, svc: Svc) -> CompactResponse:
    """Replace the oldest turns before the last `keep_recent` with one embedded summary
    (a `system` turn with `is_summary`, whose `metadata.compacted_from` lists them).
    High and saved turns stay as they are. Needs an LLM provider (409
    `provider_not_configured` without one; 409 `model_calls_disabled` when the
    namespace's owner switched model calls off). Runs on the worker pool; `defer: true`
    answers the `job_id` at once. When nothing was compacted, `reason` says why and
    `retry` whether a retry may do better."""
    got = await compacting.compact(
        svc,
        who,
        body.namespace,
        body.agent,
        body.thread_id,
        keep_recent=body.keep_recent,
        min_to_compact=body.min_to_compact,
        defer=body.defer,
    )
    return CompactResponse(**asdict(got))


@router.post(
    "/conversation.compact_status", response_model=CompactStatusResponse, responses=error_responses(404)
)
async def compact_status(
    body: CompactStatusRequest,
    who: Caller,
    svc: Svc,
) -> CompactStatusResponse:
    """The state of a deferred compaction, with its answer once complete."""
    got = await compacting.compact_status(svc, who, body.namespace, body.job_id)
    result = CompactResponse(**asdict(got.result)) if got.result is not None else None
    return CompactStatusResponse(job_id=got.job_id, state=got.state, result=result)
