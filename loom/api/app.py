"""The FastAPI app: one POST route per op under /v1, plus /healthz and /metrics.

Routes authenticate, validate and call the op; ops hold the rules; storage modules
hold the SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.routing import Route

from loom import lifecycle as process_life
from loom import logging as loom_logging
from loom import replicas
from loom.api import errors
from loom.api.deps import OP_PREFIX, authenticate, authorized
from loom.api.gate import Gate
from loom.api.observe import ObserveMiddleware, flat_routes
from loom.api.routes import erasure, health, memory, memory_answers, namespace, portability, session, webhook
from loom.api.routes import replicas as replicas_routes
from loom.api.routes import settings as settings_routes
from loom.api.routes.conversation import lifecycle, reading, saved, search
from loom.auth import policy
from loom.dashboard.app import install as install_dashboard
from loom.embedded.backends import start_backends
from loom.errors import BackendUnavailable
from loom.mcp_server.http import PATH as MCP_PATH
from loom.mcp_server.http import McpEndpoint
from loom.mcp_server.tools import SPECS
from loom.ops.platform import rates
from loom.ops.platform.health import check
from loom.read_index import figures as read_index_figures
from loom.services import Services
from loom.settings import Settings, get_settings

DOCS_STATIC = "/docs-static"  # Swagger UI's and ReDoc's files, as the package ships them

ROUTERS = [
    namespace.router,
    reading.router,
    lifecycle.router,
    search.router,
    saved.router,
    session.router,
    erasure.router,
    memory.router,
    memory_answers.router,
    webhook.router,
    portability.router,
    replicas_routes.router,
    health.router,
    settings_routes.router,
]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    clickhouse: str | None = Field(
        None, description='"ok" or "down: <kind>"; only for a caller with a valid token.'
    )
    redis: str | None = Field(
        None, description='"ok" or "down: <kind>"; only for a caller with a valid token.'
    )
    capabilities: list[str] | None = Field(
        None,
        description="What every live replica shares (see replicas.show); only for a caller with a valid token.",
    )


def create_app(services: Services | None = None, settings: Settings | None = None) -> FastAPI:
    """With `services` given (tests), the app uses them as they are; otherwise the
    lifespan opens them from settings and closes them at shutdown."""

    mcp = McpEndpoint()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = services.settings if services is not None else (settings or get_settings())
        async with mcp.running(cfg.mcp_session_run_idle_seconds), _backends(app, cfg), _sampling():
            yield

    @contextlib.asynccontextmanager
    async def _sampling() -> AsyncIterator[None]:
        # health.show's rates need readings of the counters over the last minute.
        task = asyncio.create_task(rates.sample_every())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @contextlib.asynccontextmanager
    async def _backends(app: FastAPI, cfg: Settings) -> AsyncIterator[None]:
        if services is not None:
            app.state.services = services
            yield
            return
        loom_logging.configure(cfg.log_level, verbose=cfg.log_verbose)
        backends = start_backends(cfg)
        try:
            async with process_life.running(cfg, backends.clickhouse_url, backends.redis_url, "api") as svc:
                app.state.services = svc
                process_life.settle(cfg, "api")
                yield
        finally:
            backends.stop()

    # /docs (Swagger UI) and /redoc load their scripts and styles from Loom itself
    # (fastapi-offline ships them), not from a CDN: the docs work without internet.
    app = FastAPIOffline(
        title="Loom",
        version="0.1.0",
        lifespan=lifespan,
        description="The memory store for AI agents: conversation plane, session briefs, memory.",
        static_url=DOCS_STATIC,
        favicon_url=f"{DOCS_STATIC}/favicon.png",
        # No validator badge: Swagger UI would fetch it from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    verify_policy(app)
    install_dashboard(app)
    # MCP over streamable HTTP (GET for the event stream, DELETE ends a session).
    app.router.routes.append(Route(MCP_PATH, endpoint=mcp, methods=["GET", "POST", "DELETE"]))

    # The last added runs first: observe (request id, metrics) wraps the gate.
    app.add_middleware(Gate)
    app.add_middleware(ObserveMiddleware)

    @app.get(
        "/healthz",
        tags=["ops"],
        response_model=Health,
        responses={503: {"model": Health, "description": "A backend is down (`status: degraded`)."}},
    )
    async def healthz(request: Request) -> JSONResponse:
        """`status` for anyone; each backend's state too for a caller with a valid token."""
        svc: Services = request.app.state.services
        checks = {
            "clickhouse": await check(svc.run(svc.ch.command, "SELECT 1")),
            "redis": await check(svc.redis.ping()),
        }
        ok = all(v == "ok" for v in checks.values())
        body: dict[str, Any] = {"status": "ok" if ok else "degraded"}
        if await _authenticated(svc, request.headers.get("authorization", "")):
            body.update(checks)
            with contextlib.suppress(Exception):  # Redis down: reported above
                shared = await asyncio.wait_for(replicas.shared(svc.redis), timeout=2.0)
                body["capabilities"] = sorted(shared)
        headers = None if ok else {"Retry-After": str(BackendUnavailable.retry_after)}
        return JSONResponse(body, status_code=200 if ok else 503, headers=headers)

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=PlainTextResponse,
        responses={
            200: {
                "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                "description": "Prometheus text format.",
            }
        },
    )
    async def metrics(request: Request) -> PlainTextResponse:
        found = getattr(request.app.state, "services", None)
        if found is not None:
            await read_index_figures.refresh_metrics(found)
        return PlainTextResponse(generate_latest().decode(), media_type=CONTENT_TYPE_LATEST)

    return app


def verify_policy(app: FastAPI) -> None:
    """Every op served under /v1 has its entry in loom.auth.policy and is guarded by the
    one authorization dependency, and every MCP tool names a served op: else the app
    does not start (PolicyError says which op)."""
    served = []
    for found in flat_routes(list(app.routes)):
        route = getattr(found, "original_route", found)
        path = getattr(found, "path", None) or ""
        if isinstance(route, APIRoute) and path.startswith(OP_PREFIX):
            served.append((path.removeprefix(OP_PREFIX), _guarded(route.dependant)))
    policy.verify_routes(served)
    names = {op for op, _ in served}
    for spec in SPECS:
        if spec.op not in names:
            raise policy.PolicyError(f"MCP tool {spec.name} calls {spec.op}, which no route serves")


def _guarded(dependant: Dependant) -> bool:
    return any(d.call is authorized or _guarded(d) for d in dependant.dependencies)


async def _authenticated(svc: Services, authorization: str) -> bool:
    if not authorization:
        return False
    try:
        await asyncio.wait_for(authenticate(svc, authorization), timeout=2.0)
        return True
    except Exception:  # no valid token, or no store to check it in: the short answer
        return False
