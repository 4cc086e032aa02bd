"""A thread: its turns (role, time, agent, embedding state, saved flag), the turns that
read as high shown masked until an admin reveals one, compact and delete for the roles
that may, and per turn: delete the message, or redact it (admin), each confirmed first
and answered with the op's receipt."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import attempt, refused, status_of
from loom.dashboard.render import back, page, same_origin
from loom.dashboard.visit import open_visit

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
    visit = await open_visit(request, ns)
    if visit.end_user:
        return back("/saved")
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
    return page(
        visit,
        request,
        "thread.html",
        status=status_of(got),
        title=f"Thread {thread}",
        got=got,
        agent=agent,
        thread_id=thread,
        revealed=revealed,
        compaction=compaction,
        job=job,
    )


@router.post("/thread/compact", dependencies=[Depends(same_origin)], response_model=None)
async def compact(
    request: Request,
    ns: Annotated[str, Form()],
    agent: Annotated[str, Form(max_length=256)],
    thread: Annotated[str, Form(max_length=256)],
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    async with visit.api() as api:
        done = await attempt(api.conversation.compact(agent=agent, thread_id=thread, defer=True))
    if done.value is None:
        return refused(visit, done.problem)
    return back("/thread", ns=visit.namespace, agent=agent, thread=thread, job=done.value.job_id)


@router.post("/thread/delete", dependencies=[Depends(same_origin)], response_model=None)
async def delete(
    request: Request,
    ns: Annotated[str, Form()],
    agent: Annotated[str, Form(max_length=256)],
    thread: Annotated[str, Form(max_length=256)],
    confirm: Annotated[str, Form(max_length=256)] = "",
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    async with visit.api() as api:
        done = await attempt(
            api.conversation.delete(agent=agent, thread_id=thread, confirm_thread_id=confirm)
        )
    if done.problem:
        return refused(visit, done.problem)
    return back("/conversations", ns=visit.namespace, deleted=thread)


def _receipt_query(kind: str, receipt: Any) -> dict[str, Any]:
    """What the thread page says about a removal: the op's counts, never any text."""
    written = sum(t.written for t in receipt.tables.values())
    removed = sum(t.removed for t in receipt.tables.values())
    return {"done": kind, "msg": receipt.msg_id, "written": written, "removed": removed}


@router.post("/message/delete", dependencies=[Depends(same_origin)], response_model=None)
async def delete_message(
    request: Request,
    ns: Annotated[str, Form()],
    agent: Annotated[str, Form(max_length=256)],
    thread: Annotated[str, Form(max_length=256)],
    msg: Annotated[str, Form(max_length=256)],
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    async with visit.api() as api:
        done = await attempt(api.conversation.delete_message(agent=agent, thread_id=thread, msg_id=msg))
    if done.value is None:
        return refused(visit, done.problem)
    return back(
        "/thread", ns=visit.namespace, agent=agent, thread=thread, **_receipt_query("deleted", done.value)
    )


@router.post("/message/redact", dependencies=[Depends(same_origin)], response_model=None)
async def redact(
    request: Request,
    ns: Annotated[str, Form()],
    agent: Annotated[str, Form(max_length=256)],
    thread: Annotated[str, Form(max_length=256)],
    msg: Annotated[str, Form(max_length=256)],
    span: Annotated[str, Form(max_length=100_000)] = "",
) -> HTMLResponse | RedirectResponse:
    """An exact text given: every occurrence of it; none: every span that reads as high."""
    visit = await open_visit(request, ns)
    what: dict[str, Any] = {"spans": [span]} if span else {"high": True}
    async with visit.api() as api:
        done = await attempt(api.conversation.redact(agent=agent, thread_id=thread, msg_id=msg, **what))
    if done.value is None:
        return refused(visit, done.problem)
    return back(
        "/thread", ns=visit.namespace, agent=agent, thread=thread, **_receipt_query("redacted", done.value)
    )
