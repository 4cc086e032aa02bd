"""The Saved panel: one user's saved messages, newest saved first; a search that
narrows as the user types; save and unsave. An end-user token sees only its own
(namespace "@me"); a namespace-wide token names the user."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import Outcome, ask, change
from loom.dashboard.forms import MessageForm, SaveForm
from loom.dashboard.render import page, same_origin
from loom.dashboard.visit import Visit, open_visit
from loom.replicas import SAVED_STATE

router = APIRouter()

UserQuery = Annotated[str, Query(max_length=256)]
SearchQuery = Annotated[str, Query(max_length=4_000)]


async def _list(visit: Visit, user: str) -> Outcome[Any] | None:
    if not visit.has_user(user):
        return None
    return await ask(visit, lambda api: api.saved.list(limit=50, **visit.whose(user)))


async def _search(visit: Visit, user: str, q: str) -> Outcome[Any] | None:
    if not q.strip() or not visit.has_user(user):
        return None
    return await ask(visit, lambda api: api.saved.search(query=q.strip(), limit=20, **visit.whose(user)))


@router.get("/saved", response_model=None)
async def saved(
    request: Request, ns: str | None = None, user: UserQuery = "", q: SearchQuery = ""
) -> HTMLResponse:
    visit = await open_visit(request, ns)
    deploy = await ask(visit, lambda api: api.ops.replicas())
    listed, hits = await asyncio.gather(_list(visit, user), _search(visit, user, q))
    # Saving pauses while a replica of a rolling deploy could lose saved state: no form then.
    may_save = deploy.value is not None and SAVED_STATE in deploy.value.capabilities
    return page(
        visit,
        request,
        "saved.html",
        title="Saved",
        listed=listed,
        hits=hits,
        user=user,
        q=q,
        may_save=may_save,
    )


@router.get("/saved/results", response_model=None)
async def results(
    request: Request, ns: str | None = None, user: UserQuery = "", q: SearchQuery = ""
) -> HTMLResponse:
    """The panel's result list alone: what the page's script swaps in as the user types."""
    visit = await open_visit(request, ns)
    if q.strip():
        hits = await _search(visit, user, q)
        return page(visit, request, "_saved_hits.html", hits=hits, user=user, q=q)
    listed = await _list(visit, user)
    return page(visit, request, "_saved_list.html", listed=listed, user=user, q=q)


def _message(visit: Visit, form: MessageForm) -> dict[str, Any]:
    """The message a save or unsave acts on, for whose saved messages."""
    ids = {"conversation_id": form.conversation_id, "message_id": form.message_id, "agent": form.agent}
    return ids | visit.whose(form.user)


@router.post("/saved/save", dependencies=[Depends(same_origin)], response_model=None)
async def save(request: Request, form: Annotated[SaveForm, Form()]) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, form.ns)
    # The op's model checks the role.
    saving = {"role": cast(Any, form.role), "content": form.content} if form.content else {}
    message = _message(visit, form)
    return await change(
        visit, lambda api: api.saved.save(**message, **saving), "/saved", ns=visit.namespace, user=form.user
    )


@router.post("/saved/unsave", dependencies=[Depends(same_origin)], response_model=None)
async def unsave(request: Request, form: Annotated[MessageForm, Form()]) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, form.ns)
    message = _message(visit, form)
    return await change(
        visit, lambda api: api.saved.unsave(**message), "/saved", ns=visit.namespace, user=form.user
    )
