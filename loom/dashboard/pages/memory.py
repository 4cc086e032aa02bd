"""Memory: one user's facts (memory.list: each with its validity, source and the evidence
it came from), their profile (memory.profile), one fact's history (memory.history) with
the messages it was drawn from (memory.recall), forgetting a fact after a confirmation
(memory.delete), and the facts as they stood at an earlier time (`as_of`).

A namespace-wide token names the user; an end-user token sees its own memory."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import Outcome, attempt, change, status_of
from loom.dashboard.forms import Name, Namespace
from loom.dashboard.render import page, same_origin
from loom.dashboard.visit import Visit, open_visit

router = APIRouter()

PAGE_SIZE = 50
EVIDENCE_READ = 100  # evidence read by the fact's words to find the rows it names
UserQuery = Annotated[str, Query(max_length=256)]
Ident = Annotated[str, Query(max_length=64)]


def as_of_time(raw: str) -> datetime | None:
    """The as-of field (a browser's `datetime-local`, read as UTC); ValueError if it is
    no date and time."""
    if not raw.strip():
        return None
    when = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@router.get("/memory", response_model=None)
async def memory(
    request: Request,
    ns: str | None = None,
    user: UserQuery = "",
    as_of: Annotated[str, Query(max_length=40)] = "",
    cursor: Annotated[str | None, Query(max_length=2_000)] = None,
    fact: Ident = "",
) -> HTMLResponse:
    visit = await open_visit(request, ns)
    context: dict[str, Any] = {"user": user, "as_of": as_of, "fact": fact, "cursor": cursor}
    try:
        when = as_of_time(as_of)
    except ValueError:
        when = None
        context["as_of_problem"] = "not a date and time (e.g. 2026-01-31T09:30, read as UTC)"
    context["as_of_at"] = when
    if visit.has_user(user):
        context.update(await _read(visit, user, when, cursor, fact))
    # The page's status is its main op's (memory.list: writer).
    status = status_of(context["facts"]) if "facts" in context else 200
    return page(visit, request, "memory.html", status=status, title="Memory", **context)


async def _read(
    visit: Visit, user: str, when: datetime | None, cursor: str | None, fact: str
) -> dict[str, Any]:
    whose = visit.whose(user)
    async with visit.api() as api:
        facts, profile = await asyncio.gather(
            attempt(api.memory.list(limit=PAGE_SIZE, cursor=cursor, as_of=when, **whose)),
            attempt(api.memory.profile(**whose)),
        )
        history = evidence = None
        if fact:
            history = await attempt(api.memory.history(memory_id=fact, **whose))
            if history.value is not None:
                evidence = await _evidence(api, history.value, whose)
    return {"facts": facts, "profile": profile, "history": history, "evidence": evidence}


async def _evidence(api: Any, history: Any, whose: dict[str, Any]) -> Outcome[Any]:
    """The evidence rows the fact's versions name, found by the newest version's words
    (no op reads evidence by id; a row that reads as high is never an answer)."""
    named = {e for version in history.chain for e in version.evidence_ids}
    if not named:
        return Outcome(value=[])
    newest = history.chain[-1].text
    found = await attempt(api.memory.recall(query=newest, limit=EVIDENCE_READ, **whose))
    if found.value is None:
        return found
    return Outcome(value=[h for h in found.value.hits if h.evidence_id in named])


@router.post("/memory/forget", dependencies=[Depends(same_origin)], response_model=None)
async def forget(
    request: Request,
    ns: Namespace,
    memory_id: Annotated[str, Form(min_length=1, max_length=64)],
    user: Name = "",
) -> HTMLResponse | RedirectResponse:
    visit = await open_visit(request, ns)
    return await change(
        visit,
        lambda api: api.memory.delete(memory_ids=[memory_id], **visit.whose(user)),
        "/memory",
        ns=visit.namespace,
        user=user,
        forgotten=memory_id,
    )
