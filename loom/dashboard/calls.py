"""Calling an op for a page: its answer, or the refusal the page shows in its place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.render import back, page, problem
from loom.dashboard.visit import Visit
from loom.sdk.agent import Agent
from loom.sdk.transport import LoomError

T = TypeVar("T")


@dataclass
class Outcome(Generic[T]):
    value: T | None = None
    problem: dict[str, Any] | None = None


async def attempt(call: Awaitable[T]) -> Outcome[T]:
    try:
        return Outcome(value=await call)
    except LoomError as exc:
        return Outcome(problem=problem(exc))


async def ask(visit: Visit, call: Callable[[Agent], Awaitable[T]]) -> Outcome[T]:
    """One op, called on the visit's client of the API (`call(api)`)."""
    async with visit.api() as api:
        return await attempt(call(api))


async def change(
    visit: Visit, call: Callable[[Agent], Awaitable[Any]], where: str, **query: Any
) -> HTMLResponse | RedirectResponse:
    """A form's op: the page saying it refused, or back to `where` (with `query`)."""
    done = await ask(visit, call)
    if done.problem:
        return refused(visit, done.problem)
    return back(where, **query)


def status_of(outcome: Outcome[Any]) -> int:
    """A page's status: its main op's refusal's (a call with no answer at all is a 502)."""
    if outcome.problem is None:
        return 200
    status = outcome.problem.get("status")
    return status if isinstance(status, int) and status >= 400 else 502


def about(visit: Visit, name: str, got: Outcome[Any], **context: Any) -> HTMLResponse:
    """The page about one op's outcome (`got` in its template), with that op's status."""
    return page(visit, visit.request, name, status_of(got), got=got, **context)


def refused(visit: Visit, refusal: dict[str, Any] | None) -> HTMLResponse:
    """The page that says an op refused a change (its status: a call that got no answer
    at all, status 0, is a 502)."""
    status = status_of(Outcome(problem=refusal or {}))
    return page(visit, visit.request, "refused.html", status=status, title="Refused", refused=refusal)
