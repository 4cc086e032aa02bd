"""Imports (admin): the namespace's latest imports (import.status), each with what it
read and stored, its errors with their file positions, and its background embedding's
progress. An import runs from `loom import`; this page follows it (reload to update)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import ask, status_of
from loom.dashboard.render import page
from loom.dashboard.visit import staff_visit

router = APIRouter()


@router.get("/imports", response_model=None)
async def imports(request: Request, ns: str | None = None) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    found = await ask(visit, lambda api: api.portability.import_status(namespace=visit.namespace))
    return page(visit, request, "imports.html", status=status_of(found), title="Imports", found=found)
