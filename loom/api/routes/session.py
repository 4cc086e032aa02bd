"""Routes of the session briefs: session.brief_save, _get, _list, _delete."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from loom.api.deps import Caller, Svc
from loom.models.errors import COMMON, error_responses
from loom.models.session import (
    BriefDeleteRequest,
    BriefDeleteResponse,
    BriefGetRequest,
    BriefGetResponse,
    BriefListItem,
    BriefListRequest,
    BriefListResponse,
    BriefSaveRequest,
    BriefSaveResponse,
)
from loom.ops import briefs as ops

router = APIRouter(prefix="/v1", tags=["session"], responses=error_responses(*COMMON))


@router.post("/session.brief_save", response_model=BriefSaveResponse, responses=error_responses(409))
async def brief_save(body: BriefSaveRequest, who: Caller, svc: Svc) -> BriefSaveResponse:
    """Revise (or start) a brief from events, from sections the agent wrote, or both."""
    return await ops.save(svc, who, body)


@router.post("/session.brief_get", response_model=BriefGetResponse, responses=error_responses(404))
async def brief_get(body: BriefGetRequest, who: Caller, svc: Svc) -> BriefGetResponse:
    """Load a brief by brief_key, else the newest one a session wrote, else the newest for a project."""
    return await ops.brief_get(svc, who, body)


@router.post("/session.brief_list", response_model=BriefListResponse)
async def brief_list(body: BriefListRequest, who: Caller, svc: Svc) -> BriefListResponse:
    """The namespace's briefs, newest first, one line each."""
    items = await ops.brief_list(svc, who, body)
    return BriefListResponse(
        namespace=who.namespace(body.namespace), briefs=[BriefListItem(**asdict(i)) for i in items]
    )


@router.post("/session.brief_delete", response_model=BriefDeleteResponse)
async def brief_delete(body: BriefDeleteRequest, who: Caller, svc: Svc) -> BriefDeleteResponse:
    """Delete a brief (and every revision of it) when its writer asks for it to be forgotten."""
    deleted = await ops.brief_delete(svc, who, body)
    return BriefDeleteResponse(
        namespace=who.namespace(body.namespace), brief_key=body.brief_key, deleted=deleted
    )
