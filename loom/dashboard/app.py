"""Mounts the dashboard on the API app: the pages under /dashboard, its static files,
and the sign-in redirect."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from loom.dashboard.pages import (
    briefs,
    conversations,
    imports,
    knowledge,
    operations,
    review,
    saved,
    signin,
    threads,
)
from loom.dashboard.render import HERE
from loom.dashboard.visit import PATH, SignInNeeded

PAGES = [signin, conversations, threads, saved, briefs, review, knowledge, operations, imports]


def install(app: FastAPI) -> None:
    router = APIRouter(prefix=PATH, include_in_schema=False)
    for module in PAGES:
        router.include_router(module.router)
    app.include_router(router)
    app.add_api_route(PATH, signin.home, include_in_schema=False)  # /dashboard without the slash
    app.mount(f"{PATH}/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")

    @app.exception_handler(SignInNeeded)
    async def sign_in(request: Request, exc: SignInNeeded) -> RedirectResponse:
        return RedirectResponse(f"{PATH}/signin", status_code=303, headers={"Cache-Control": "no-store"})
