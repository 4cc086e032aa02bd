"""The operator's pages: Retention and tiering (what the server has in force per
table) and Health (backends, the job queue, embedding outcomes, rates)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.calls import ask, status_of
from loom.dashboard.render import page
from loom.dashboard.visit import staff_visit

router = APIRouter()

# The tables that hold what people and agents wrote, as the Retention page names them;
# the rest (indexes derived from these, bookkeeping) are listed behind a toggle.
USER_TABLES = {
    "conversations": "Transcript turns",
    "conversation_embeddings": "Turn embeddings",
    "threads": "Threads (titles, metadata)",
    "memories": "Memory facts",
    "memory_evidence": "Messages memory was drawn from",
    "memory_profiles": "User profiles",
    "session_briefs": "Session briefs",
    "session_brief_revisions": "Brief revisions",
}


@router.get("/retention", response_model=None)
async def retention(request: Request, ns: str | None = None) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    shown = await ask(visit, lambda api: api.erasure.retention())
    tables = shown.value.tables if shown.value else []
    return page(
        visit,
        request,
        "retention.html",
        status=status_of(shown),
        title="Retention and tiering",
        shown=shown,
        user_tables=[(label, t) for name, label in USER_TABLES.items() for t in tables if t.table == name],
        internal_tables=[("", t) for t in tables if t.table not in USER_TABLES],
    )


@router.get("/health", response_model=None)
async def health(request: Request, ns: str | None = None) -> HTMLResponse | RedirectResponse:
    visit = await staff_visit(request, ns)
    shown = await ask(visit, lambda api: api.ops.health())
    return page(visit, request, "health.html", status=status_of(shown), title="Health", shown=shown)
