"""The FastAPI app: one POST route per op under /v1, plus /healthz and /metrics.

Routes authenticate, validate and call the op; ops hold the rules; storage modules
hold the SQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loom import logging as loom_logging
from loom.api import errors
from loom.api.observe import ObserveMiddleware
from loom.api.routes import briefs, conversation, erasure, namespaces, saved, search
from loom.embedded.backends import start_backends
from loom.gc_tuning import calm_the_garbage_collector
from loom.services import Services, open_services
from loom.settings import Settings, get_settings

log = loom_logging.get("loom.api")

ROUTERS = [namespaces.router, conversation.router, search.router, saved.router, briefs.router, erasure.router]


def create_app(services: Services | None = None, settings: Settings | None = None) -> FastAPI:
    """With `services` given (tests), the app uses them as they are; otherwise the
    lifespan opens them from settings and closes them at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if services is not None:
            app.state.services = services
            yield
            return
        cfg = settings or get_settings()
        loom_logging.configure(cfg.log_level)
        backends = start_backends(cfg)
        svc = await open_services(cfg, backends.clickhouse_url, backends.redis_url)
        app.state.services = svc
        calm_the_garbage_collector()
        try:
            yield
        finally:
            await svc.close()
            backends.stop()

    app = FastAPI(title="Loom", version="0.1.0", lifespan=lifespan,
                  description="The memory store for AI agents: conversation plane, session briefs, memory.")
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)

    app.add_middleware(ObserveMiddleware)

    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request) -> JSONResponse:
        svc: Services = request.app.state.services
        checks = {"clickhouse": await _check(svc.run(svc.ch.command, "SELECT 1")),
                  "redis": await _check(svc.redis.ping())}
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app


async def _check(probe: Awaitable[object]) -> str:
    import asyncio

    try:
        await asyncio.wait_for(probe, timeout=2.0)
        return "ok"
    except Exception as exc:  # a health probe reports, it never raises
        return f"down: {type(exc).__name__}: {exc}"[:200]
