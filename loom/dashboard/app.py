"""Mounts the dashboard on the API app: the pages under /dashboard, its static files,
the sign-in redirect, and its own page for a path it does not have."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from loom.api.errors import BACKEND_ERRORS, add_not_found_page
from loom.dashboard.pages import (
    briefs,
    conversations,
    imports,
    knowledge,
    memory,
    operations,
    review,
    saved,
    signin,
    threads,
)
from loom.dashboard.render import HERE, back, page
from loom.dashboard.visit import PATH, SavedOnly, SignInNeeded, Visit, open_visit

PAGES = [signin, conversations, threads, saved, memory, briefs, review, knowledge, operations, imports]


def install(app: FastAPI) -> None:
    router = APIRouter(prefix=PATH, include_in_schema=False)
    for module in PAGES:
        router.include_router(module.router)
    app.include_router(router)
    app.add_api_route(PATH, signin.home, include_in_schema=False)  # /dashboard without the slash
    app.mount(f"{PATH}/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
    add_not_found_page(app, PATH, not_found)

    @app.exception_handler(SignInNeeded)
    async def sign_in(request: Request, exc: SignInNeeded) -> RedirectResponse:
        return RedirectResponse(f"{PATH}/signin", status_code=303, headers={"Cache-Control": "no-store"})

    @app.exception_handler(SavedOnly)
    async def saved_only(request: Request, exc: SavedOnly) -> RedirectResponse:
        return back("/saved")


async def not_found(request: Request) -> HTMLResponse:
    """A dashboard path with no page: the dashboard's own 404, with its menu for a
    signed-in visitor."""
    visit: Visit | None
    try:
        visit = await open_visit(request, request.query_params.get("ns"))
    except SignInNeeded:
        visit = None
    except BACKEND_ERRORS:  # no token store to ask: the page without the menu
        visit = None
    return page(visit, request, "not_found.html", status=404, title="Not found")
