"""Routes of the ops on a thread's life: conversation.compact and compact_status
(writer), delete, delete_message, redact and set_logging (admin)."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models.conversation import lifecycle as k
from loom.models.errors import error_responses
from loom.models.namespace import NamespaceConfigResponse
from loom.ops.conversation.lifecycle import compacting, deleting, deleting_message, redacting
from loom.ops.conversation.lifecycle.message_removal import Receipt
from loom.ops.platform import namespaces

router = op_router("conversation")


@router.post("/conversation.compact", response_model=k.CompactResponse, responses=error_responses(409))
async def compact(body: k.CompactRequest, who: Caller, svc: Svc) -> k.CompactResponse:
    """Replace the oldest turns before the last `keep_recent` with one embedded summary
    (a `system` turn with `is_summary`, whose `metadata.compacted_from` lists them).
    High and saved turns stay as they are. Needs an LLM provider (409
    `provider_not_configured` without one; 409 `model_calls_disabled` when the
    namespace's owner switched model calls off). Runs on the worker pool; `defer: true`
    answers the `job_id` at once. When nothing was compacted, `reason` says why and
    `retry` whether a retry may do better."""
    got = await compacting.compact(svc, who, body)
    return k.CompactResponse(**asdict(got))


@router.post(
    "/conversation.compact_status", response_model=k.CompactStatusResponse, responses=error_responses(404)
)
async def compact_status(body: k.CompactStatusRequest, who: Caller, svc: Svc) -> k.CompactStatusResponse:
    """The state of a deferred compaction, with its answer once complete."""
    got = await compacting.compact_status(svc, who, body.namespace, body.job_id)
    result = k.CompactResponse(**asdict(got.result)) if got.result is not None else None
    return k.CompactStatusResponse(job_id=got.job_id, state=got.state, result=result)


@router.post("/conversation.delete", response_model=k.DeleteResponse)
async def delete(body: k.DeleteRequest, who: Caller, svc: Svc) -> k.DeleteResponse:
    """Tombstone one thread (this agent's turns, its thread row, their embeddings).
    `confirm_thread_id` must equal `thread_id` (else 422, nothing written). An embedding
    row another agent's live copy of the turn shares passes to that copy."""
    result = await deleting.delete(
        svc, who, body.namespace, body.agent, body.thread_id, body.confirm_thread_id
    )
    return k.DeleteResponse(**asdict(result))


def _receipt(r: Receipt) -> dict[str, object]:
    body = asdict(r)
    del body["action"], body["done"], body["started"]
    return body


@router.post(
    "/conversation.delete_message", response_model=k.DeleteMessageResponse, responses=error_responses(404)
)
async def delete_message(body: k.DeleteMessageRequest, who: Caller, svc: Svc) -> k.DeleteMessageResponse:
    """Remove one turn, its embedding row and every copy derived from it (saved index,
    vector tables, memory evidence; a summary built from it is tombstoned and its turns
    come back); every older version leaves the disk before the answer, a receipt.
    Admin; a writer for a turn its token appended. An end-user token never removes a
    recorded turn: on its own saved message it does what conversation.unsave_message
    does (`unsaved: true`), and on anything else answers `found: false`. Idempotent:
    asked again, `found` and `deleted` are false."""
    r = await deleting_message.delete_message(
        svc, who, body.namespace, body.agent, body.thread_id, body.msg_id
    )
    return k.DeleteMessageResponse(deleted=r.done, **_receipt(r))


@router.post("/conversation.redact", response_model=k.RedactResponse, responses=error_responses(404))
async def redact(body: k.RedactRequest, who: Caller, svc: Svc) -> k.RedactResponse:
    """Replace spans of one turn (exact `spans`, character `ranges`, or `high: true`) with
    a placeholder, keeping the turn in place; the old text leaves the disk and every
    derived copy; the turn is screened and embedded again. A receipt, never the text."""
    r = await redacting.redact(svc, who, body)
    return k.RedactResponse(redacted=r.done, **_receipt(r))


@router.post("/conversation.set_logging", response_model=NamespaceConfigResponse)
async def set_logging(body: k.SetLoggingRequest, who: Caller, svc: Svc) -> NamespaceConfigResponse:
    """Switch transcript recording for a namespace (off by default; no row = off)."""
    config = await namespaces.set_logging(svc, who, body.namespace, body.enabled)
    return NamespaceConfigResponse(**asdict(config))
