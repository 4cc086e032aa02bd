"""Routes of the session briefs: session.brief_save, _get, _list, _delete."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models import session as b
from loom.models.errors import error_responses
from loom.ops import briefs as ops

router = op_router("session")


@router.post("/session.brief_save", response_model=b.BriefSaveResponse, responses=error_responses(409))
async def brief_save(body: b.BriefSaveRequest, who: Caller, svc: Svc) -> b.BriefSaveResponse:
    """Revise (or start) a brief from events, from sections the agent wrote, or both."""
    return await ops.save(svc, who, body)


@router.post("/session.brief_get", response_model=b.BriefGetResponse, responses=error_responses(404))
async def brief_get(body: b.BriefGetRequest, who: Caller, svc: Svc) -> b.BriefGetResponse:
    """Load a brief by brief_key, else the newest one a session wrote, else the newest for a project."""
    return await ops.brief_get(svc, who, body)


@router.post("/session.brief_list", response_model=b.BriefListResponse)
async def brief_list(body: b.BriefListRequest, who: Caller, svc: Svc) -> b.BriefListResponse:
    """The namespace's briefs, newest first, one line each."""
    items = await ops.brief_list(svc, who, body)
    return b.BriefListResponse(
        namespace=who.namespace(body.namespace), briefs=[b.BriefListItem(**asdict(i)) for i in items]
    )


@router.post("/session.brief_delete", response_model=b.BriefDeleteResponse)
async def brief_delete(body: b.BriefDeleteRequest, who: Caller, svc: Svc) -> b.BriefDeleteResponse:
    """Delete a brief (and every revision of it) when its writer asks for it to be forgotten."""
    deleted = await ops.brief_delete(svc, who, body)
    return b.BriefDeleteResponse(
        namespace=who.namespace(body.namespace), brief_key=body.brief_key, deleted=deleted
    )
