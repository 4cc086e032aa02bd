"""Per-request observation as a pure ASGI middleware: the request id and the metrics.

Every request gets a request id (the client's ``x-request-id``, else a new one), bound
into structlog's contextvars for the request's logs and echoed in the response's
``x-request-id`` header; every ``/v1/`` request is counted and timed per route and
status. The route label is the route's template; every path no route serves shares
the one label ``unmatched``, so unknown paths cannot grow the metrics.

Why not ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware runs the app in a
task group of its own and streams the response through memory channels, which cost
the API's event loop about 0.3 ms per request, a large share of a small append.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import MutableMapping
from typing import Any

import structlog
from prometheus_client import Counter, Histogram
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter("loom_requests_total", "API requests", ["route", "status"])
LATENCY = Histogram(
    "loom_request_seconds",
    "API request latency",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

_REQUEST_ID = b"x-request-id"
# A new request id is this process's random prefix and a counter: unique enough to
# correlate logs, and free (uuid4 reads os.urandom, a syscall per request).
_PREFIX = os.urandom(4).hex()
_COUNTER = itertools.count(1)

UNMATCHED = "unmatched"
_TEMPLATE = "loom.route_template"


class _RouteIndex:
    """Path -> route template: a dict for the routes without path parameters (every
    /v1 op), a scan of the others."""

    def __init__(self, routes: list[Any]) -> None:
        self.static: dict[str, str] = {}
        self.dynamic: list[tuple[Any, str]] = []
        for route in routes:
            template = str(getattr(route, "path", None) or "")
            mounted = isinstance(getattr(route, "original_route", route), Mount)  # serves a whole subtree
            if template and "{" not in template and not mounted:
                self.static[template] = template
            elif template:
                self.dynamic.append((route, template))

    def template(self, scope: Scope) -> str | None:
        found = self.static.get(scope["path"])
        if found is not None:
            return found
        for route, template in self.dynamic:
            if route.matches(scope)[0] != Match.NONE:
                return template
        return None


def flat_routes(routes: list[BaseRoute]) -> list[Any]:
    """Every route of the app under its full path (each with `.path` and `.original_route`
    on FastAPI 0.16x, the route itself before)."""
    # FastAPI from 0.16x keeps an included router as one entry of app.routes; its
    # iter_route_contexts yields each route under its full path.
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return list(routes)
    return list(iter_route_contexts(routes))


def route_template(scope: Scope) -> str | None:
    """The template of the app's route serving this request's path, or None (kept in
    the scope: the gate and the metrics both ask)."""
    if _TEMPLATE in scope:
        kept: str | None = scope[_TEMPLATE]
        return kept
    router = scope["app"].router
    index: _RouteIndex | None = getattr(router, "_loom_route_index", None)
    if index is None:
        index = _RouteIndex(flat_routes(list(router.routes)))
        router._loom_route_index = index
    found = scope[_TEMPLATE] = index.template(scope)
    return found


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == _REQUEST_ID and value:
            return str(value.decode("latin-1"))
    return f"{_PREFIX}{next(_COUNTER):08x}"


class ObserveMiddleware:
    """See the module docstring. HTTP only; lifespan and websockets pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        header = (_REQUEST_ID, request_id.encode("latin-1"))
        path: str = scope.get("path", "")
        status = 500  # what the client sees if the app raises before it answers
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                _add_header(message, header)
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.clear_contextvars()
            if path.startswith("/v1/"):
                route = route_template(scope) or UNMATCHED
                REQUESTS.labels(route, str(status)).inc()
                LATENCY.labels(route).observe(time.perf_counter() - start)


def _add_header(message: MutableMapping[str, Any], header: tuple[bytes, bytes]) -> None:
    headers = list(message.get("headers", ()))
    headers.append(header)
    message["headers"] = headers
