"""Routes of erasure.request / status / export and retention.show (all admin; tokens
bound to one user or session are refused)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi.responses import StreamingResponse

from loom.api.deps import Caller, Svc, op_router
from loom.models.erasure import (
    ErasureRequest,
    ErasureResponse,
    ErasureStatusRequest,
    ExportRequest,
    RetentionShowRequest,
    RetentionShowResponse,
)
from loom.models.errors import error_responses
from loom.ops import erasure as ops
from loom.ops.erasure import retention
from loom.store.erasure import Request

router = op_router("deletion and erasure")


def _erasure(req: Request) -> ErasureResponse:
    return ErasureResponse.model_validate(asdict(req) | {"receipt": req.receipt.as_json()})


@router.post("/erasure.request", response_model=ErasureResponse)
async def erasure_request(body: ErasureRequest, who: Caller, svc: Svc) -> ErasureResponse:
    """Erase a user (`user_id`, in the token's namespaces or those listed) or whole
    namespaces (`namespace_list`, with `purge: true`). Answers once nothing of the
    subject is readable, with a receipt; the removal from disk runs on the worker pool
    (poll erasure.status)."""
    req = await ops.request(
        svc,
        who,
        user_id=body.user_id,
        namespaces=body.namespaces,
        namespace_list=body.namespace_list,
        purge=body.purge,
    )
    return _erasure(req)


@router.post("/erasure.status", response_model=ErasureResponse, responses=error_responses(404))
async def erasure_status(body: ErasureStatusRequest, who: Caller, svc: Svc) -> ErasureResponse:
    """An erasure's progress (`steps_done` of `steps_total`, `state`) and its receipt."""
    return _erasure(await ops.status(svc, who, body.erasure_id))


@router.post(
    "/erasure.export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
async def erasure_export(body: ExportRequest, who: Caller, svc: Svc) -> StreamingResponse:
    """A user's rows as NDJSON, streamed: a header line, transcript rows (`kind: "turn"`,
    tombstoned included unless `include_tombstoned: false`), briefs and their revisions,
    and an `end` line with the row count. Never embedding rows."""
    stream = ops.export(svc, who, body.user_id, body.namespaces, include_tombstoned=body.include_tombstoned)
    return StreamingResponse(stream, media_type="application/x-ndjson")


@router.post("/retention.show", response_model=RetentionShowResponse)
async def retention_show(body: RetentionShowRequest, who: Caller, svc: Svc) -> RetentionShowResponse:
    """Each table's TTL and storage policy as the server reports them, and whether
    tiering applies."""
    report = await retention.show(svc, who)
    return RetentionShowResponse(**asdict(report))
