"""The gate every request passes before any route reads its body (a pure ASGI middleware).

1. A body larger than LOOM_MAX_BODY_BYTES is refused with 413 before a byte of it is
   read: by its Content-Length when it declares one, else (a chunked body) by counting
   what the route reads, which stops at the limit.
2. On a ``/v1`` route the bearer token is checked before the body is read or parsed:
   a request without a valid token costs the server its headers only, whatever it
   sends. The verified caller is left in the scope for the route's own role and scope
   check (``loom.api.deps``), so the token is looked up once.
3. The token lookup's backend failure is a 503 like any other (``loom.api.errors``).
4. A ``/v1`` body is JSON whatever its declared type: a body sent with no content type,
   or with the form type ``curl -d`` sends by default (or ``text/plain``), is read as
   JSON. Every op takes JSON and authenticates by the bearer header, which a page of
   another site cannot send without a CORS preflight, so the cross-site reason for
   refusing such bodies does not apply to them.

Why not FastAPI's dependencies: FastAPI reads and parses a route's body before it runs
the route's dependencies, so the token check there comes after the body.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.api import errors
from loom.api.deps import PRINCIPAL, authenticate
from loom.api.observe import route_template
from loom.errors import BodyTooLarge, LoomError


def too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the request body is larger than {limit:,} bytes (LOOM_MAX_BODY_BYTES)",
        field="body",
        rule="max_body_bytes",
    )


class Gate:
    """See the module docstring. HTTP only; lifespan and websockets pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.limit: int | None = None  # LOOM_MAX_BODY_BYTES, read from the app's services once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        svc = scope["app"].state.services
        if self.limit is None:
            self.limit = int(svc.settings.max_body_bytes)
        limit = self.limit
        # One pass over the headers (this runs on every request of the hot path).
        length = authorization = kind = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"authorization":
                authorization = value
            elif name == b"content-type":
                kind = value
        refusal = None
        if length.isdigit() and int(length) > limit:
            refusal = errors.loom_response(too_large(limit))
        elif scope["path"].startswith("/v1/") and route_template(scope) is not None:
            refusal = await _authenticate(scope, svc, authorization.decode("latin-1"))
            if kind.split(b";", 1)[0].strip().lower() in _READ_AS_JSON:
                scope["headers"] = _as_json(scope["headers"])
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _counting(receive, limit), send)


# Declared types a /v1 body is read as JSON under (see the module docstring, 4).
_READ_AS_JSON = frozenset({b"", b"application/x-www-form-urlencoded", b"text/plain"})


def _as_json(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name != b"content-type"]
    return [*kept, (b"content-type", b"application/json")]


async def _authenticate(scope: Scope, svc: Any, authorization: str) -> Any:
    try:
        scope[PRINCIPAL] = await authenticate(svc, authorization)
    except LoomError as exc:
        return errors.loom_response(exc)
    except errors.BACKEND_ERRORS as exc:
        return errors.backend_failure(exc, scope["path"])
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                # Raised inside the route's read: the route answers it (413) and
                # nothing beyond the limit is buffered.
                raise too_large(limit)
        return message

    return counted
