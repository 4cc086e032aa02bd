"""A thread: its turns (role, time, agent, embedding state, saved flag), the turns that
read as high shown masked until an admin reveals one, compact and delete for the roles
that may, and per turn: delete the message, or redact it (admin), each confirmed first
and answered with the op's receipt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import about, ask, attempt, change, refused
from loom.dashboard.forms import Name, Namespace, Text
from loom.dashboard.render import back, same_origin
from loom.dashboard.visit import Visit, open_visit, staff_visit
from loom.sdk.agent import Agent

router = APIRouter()

TURNS_PER_PAGE = 100
Ident = Annotated[str, Query(min_length=1, max_length=256)]


@router.get("/thread", response_model=None)
async def thread(
    request: Request,
    agent: Ident,
    thread: Ident,
    ns: str | None = None,
    reveal: Annotated[str, Query(max_length=256)] = "",
    cursor: Annotated[str | None, Query(max_length=4096)] = None,
    job: Annotated[str, Query(max_length=128)] = "",
) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    async with visit.api() as api:
        got = await attempt(
            api.conversation.get(
                agent=agent,
                thread_id=thread,
                include_messages=True,
                include_embedding=True,
                limit=TURNS_PER_PAGE,
                cursor=cursor,
            )
        )
        compaction = await attempt(api.conversation.compact_status(job_id=job)) if job else None
    # Only an admin may reveal, and only the one turn asked for: the others stay out of the HTML.
    revealed = reveal if visit.may("admin") else ""
    return about(
        visit,
        "thread.html",
        got,
        title=f"Thread {thread}",
        agent=agent,
        thread_id=thread,
        revealed=revealed,
        compaction=compaction,
        job=job,
    )


@router.post("/thread/compact", dependencies=[Depends(same_origin)], response_model=None)
async def compact(
    request: Request, ns: Namespace, agent: Name, thread: Name
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    done = await ask(visit, lambda api: api.conversation.compact(agent=agent, thread_id=thread, defer=True))
    if done.value is None:
        return refused(visit, done.problem)
    return back("/thread", ns=visit.namespace, agent=agent, thread=thread, job=done.value.job_id)


@router.post("/thread/delete", dependencies=[Depends(same_origin)], response_model=None)
async def delete(
    request: Request, ns: Namespace, agent: Name, thread: Name, confirm: Name = ""
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    return await change(
        visit,
        lambda api: api.conversation.delete(agent=agent, thread_id=thread, confirm_thread_id=confirm),
        "/conversations",
        ns=visit.namespace,
        deleted=thread,
    )


async def _removed(
    visit: Visit, kind: str, agent: str, thread: str, call: Callable[[Agent], Awaitable[Any]]
) -> HTMLResponse | RedirectResponse:
    """Back to the thread after a removal, saying what the op's receipt counts (never any text)."""
    done = await ask(visit, call)
    if done.value is None:
        return refused(visit, done.problem)
    receipt = done.value
    written = sum(t.written for t in receipt.tables.values())
    removed = sum(t.removed for t in receipt.tables.values())
    counts = {"done": kind, "msg": receipt.msg_id, "written": written, "removed": removed}
    return back("/thread", ns=visit.namespace, agent=agent, thread=thread, **counts)


@router.post("/message/delete", dependencies=[Depends(same_origin)], response_model=None)
async def delete_message(
    request: Request, ns: Namespace, agent: Name, thread: Name, msg: Name
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    return await _removed(
        visit,
        "deleted",
        agent,
        thread,
        lambda api: api.conversation.delete_message(agent=agent, thread_id=thread, msg_id=msg),
    )


@router.post("/message/redact", dependencies=[Depends(same_origin)], response_model=None)
async def redact(
    request: Request, ns: Namespace, agent: Name, thread: Name, msg: Name, span: Text = ""
) -> HTMLResponse | RedirectResponse:
    """An exact text given: every occurrence of it; none: every span that reads as high."""
    visit = await open_visit(request, ns)
    what: dict[str, Any] = {"spans": [span]} if span else {"high": True}
    return await _removed(
        visit,
        "redacted",
        agent,
        thread,
        lambda api: api.conversation.redact(agent=agent, thread_id=thread, msg_id=msg, **what),
    )
