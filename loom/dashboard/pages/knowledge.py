"""Settings: the live settings, in the groups the owner knows them by (Knowledge →
Conversations: the search floor, the excerpt length, the titler's switch, cadence,
window, minimum turns and per-pass cap; Retention and storage tiering; Context; Mcp).
An admin's change is stored by settings.set and reaches every API and worker process
within seconds; the page shows where each value comes from, and the latest changes.
Shortening retention deletes turns: the page asks for a confirmation first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import ask, status_of
from loom.dashboard.render import back, page, same_origin
from loom.dashboard.visit import Visit, open_visit, staff_visit

router = APIRouter()

RESET = "reset"  # the form field naming a setting to put back to its default
CONFIRM = "confirm_shorter_retention"  # the form's checkbox: shortening retention deletes turns


@router.get("/settings", response_model=None)
async def settings(
    request: Request, ns: str | None = None, saved: int = 0
) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    return await _render(visit, saved=bool(saved))


@router.post("/settings", dependencies=[Depends(same_origin)], response_model=None)
async def change(request: Request) -> HTMLResponse | RedirectResponse:
    form = await request.form()
    visit = await open_visit(request, str(form.get("ns", "")) or None)
    current = await ask(visit, lambda api: api.settings.get())
    if current.value is None:
        return await _render(visit)
    known = {s.name: s for s in current.value.settings}
    reset = str(form.get(RESET, ""))
    if reset:
        values: dict[str, Any] = {reset: None}
    else:
        entered = {name: _typed(str(form[name]), known[name].type) for name in known if name in form}
        values = {name: value for name, value in entered.items() if value != known[name].value}
    if not values:
        return back("/settings", ns=visit.namespace)
    done = await ask(
        visit, lambda api: api.settings.set(values=values, confirm_shorter_retention=CONFIRM in form)
    )
    if done.problem:
        typed = {name: str(form[name]) for name in known if name in form}
        return await _render(visit, problem=done.problem, entered=typed, status=status_of(done))
    return back("/settings", ns=visit.namespace, saved=1)


async def _render(
    visit: Visit,
    *,
    saved: bool = False,
    problem: dict[str, Any] | None = None,
    entered: dict[str, str] | None = None,
    status: int = 200,
) -> HTMLResponse:
    shown = await ask(visit, lambda api: api.settings.get())
    error_field = str(problem.get("field") or "") if problem else ""
    return page(
        visit,
        visit.request,
        "settings.html",
        status=status if shown.value is not None else status_of(shown),
        title="Knowledge → Conversations",
        shown=shown,
        saved=saved,
        problem=problem,
        error_for=error_field.removeprefix("values."),
        entered=entered or {},
        labels={s.name: s.label for s in shown.value.settings} if shown.value else {},
    )


def _typed(raw: str, kind: str) -> Any:
    """A form's text as the setting's JSON type; text that is not one is sent as it is,
    so the op names the rule it breaks."""
    raw = raw.strip()
    try:
        if kind == "bool":
            return {"true": True, "false": False}.get(raw.lower(), raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "str":
            return raw
    except ValueError:
        return raw
    return raw
