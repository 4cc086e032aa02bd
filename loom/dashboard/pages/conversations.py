"""The Conversations page: the Record conversations switch, search over the namespace,
the threads of every agent (newest first), and the briefs section."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import attempt, change
from loom.dashboard.forms import Namespace
from loom.dashboard.render import page, same_origin
from loom.dashboard.visit import open_visit, staff_visit

router = APIRouter()

PAGE_SIZE = 25
ALL_AGENTS = "*"
# "Every thread": conversation.threads reads threads active in a window of days.
WINDOW_DAYS = 36_500


@router.get("/conversations", response_model=None)
async def conversations(
    request: Request,
    ns: str | None = None,
    offset: Annotated[int, Query(ge=0, le=100_000)] = 0,
    q: Annotated[str, Query(max_length=4_000)] = "",
) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    async with visit.api() as api:
        config, threads, briefs = await asyncio.gather(
            attempt(api.namespaces.get_config()),
            attempt(
                api.conversation.threads(
                    agent=ALL_AGENTS, window_days=WINDOW_DAYS, limit=PAGE_SIZE, offset=offset
                )
            ),
            attempt(api.briefs.list(limit=50)),
        )
        hits = None
        if q.strip():
            hits = await attempt(
                api.conversation.search(namespace_scope="one", agent=ALL_AGENTS, query=q.strip(), limit=20)
            )
    return page(
        visit,
        request,
        "conversations.html",
        title="Conversations",
        config=config,
        threads=threads,
        briefs=briefs,
        hits=hits,
        q=q,
        offset=offset,
        page_size=PAGE_SIZE,
    )


@router.post("/conversations/recording", dependencies=[Depends(same_origin)], response_model=None)
async def recording(
    request: Request, ns: Namespace, enabled: Annotated[bool, Form()]
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    return await change(
        visit, lambda api: api.conversation.set_logging(enabled=enabled), "/conversations", ns=visit.namespace
    )
