"""Review: the namespace's turns that read as high sensitivity (admin), so an owner can
find them and clean them up. The list names each turn and the kinds of shape found,
never the text; opening one shows it masked in its thread until revealed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import ask, status_of
from loom.dashboard.render import page
from loom.dashboard.visit import staff_visit

router = APIRouter()

PAGE_SIZE = 50


@router.get("/review", response_model=None)
async def review(
    request: Request, ns: str | None = None, offset: Annotated[int, Query(ge=0, le=100_000)] = 0
) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    found = await ask(visit, lambda api: api.conversation.high_turns(limit=PAGE_SIZE, offset=offset))
    return page(
        visit,
        request,
        "review.html",
        status=status_of(found),
        title="Turns that read as high",
        found=found,
        offset=offset,
        page_size=PAGE_SIZE,
    )
