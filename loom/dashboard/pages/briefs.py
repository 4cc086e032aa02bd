"""A session brief: its sections, its revisions, loading it (full=true, with the
client's own last compaction summary below), and deleting it. Briefs never load on
their own: this page is where a person asks for one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import about, ask, change
from loom.dashboard.forms import Namespace
from loom.dashboard.render import same_origin
from loom.dashboard.visit import open_visit, staff_visit

router = APIRouter()


@router.get("/brief", response_model=None)
async def brief(
    request: Request,
    key: Annotated[str, Query(min_length=1, max_length=512)],
    ns: str | None = None,
    revision: Annotated[int | None, Query(ge=1)] = None,
    full: bool = False,
) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    got = await ask(visit, lambda api: api.briefs.get(brief_key=key, revision=revision, full=full))
    return about(visit, "brief.html", got, title=f"Brief {key}", key=key, full=full, revision=revision)


@router.post("/brief/delete", dependencies=[Depends(same_origin)], response_model=None)
async def delete(
    request: Request, ns: Namespace, key: Annotated[str, Form(max_length=512)]
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    return await change(
        visit, lambda api: api.briefs.delete(brief_key=key), "/conversations", ns=visit.namespace
    )
