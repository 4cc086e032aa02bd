"""The FastAPI app: one POST route per op under /v1, plus /healthz and /metrics.

Routes authenticate, validate and call the op; ops hold the rules; storage modules
hold the SQL.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from loom import logging as loom_logging
from loom.api import errors
from loom.api.routes import briefs, conversation, namespaces
from loom.embedded.backends import start_backends
from loom.services import Services, open_services
from loom.settings import Settings, get_settings

REQUESTS = Counter("loom_requests_total", "API requests", ["route", "status"])
LATENCY = Histogram("loom_request_seconds", "API request latency", ["route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

log = loom_logging.get("loom.api")

ROUTERS = [namespaces.router, conversation.router, briefs.router]


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

    @app.middleware("http")
    async def observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        structlog.contextvars.bind_contextvars(request_id=request_id)
        route = request.url.path
        start = time.perf_counter()
        try:
            response = await call_next(request)
        finally:
            structlog.contextvars.clear_contextvars()
        elapsed = time.perf_counter() - start
        if route.startswith("/v1/"):
            REQUESTS.labels(route, str(response.status_code)).inc()
            LATENCY.labels(route).observe(elapsed)
        response.headers["x-request-id"] = request_id
        return response

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
