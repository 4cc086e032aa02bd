"""Every error leaves the API as JSON with a stable `error` code; bad input is a 422.

Backend failures are mapped here, in one place: any ClickHouse client error, Redis
error or socket/timeout error (OSError, which TimeoutError is) that reaches the API,
from any op or from the token lookup, answers 503 ``backend_unavailable`` with a
``Retry-After`` header and a fixed message. The driver's own text never leaves the
server: it can carry the internal URL and the parameters of a query made for another
namespace. The server log keeps the detail.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from clickhouse_connect.driver.exceptions import Error as ClickHouseError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from loom import logging as loom_logging
from loom.errors import BackendUnavailable, LoomError
from loom.models.bounds import DEPTH_RULE

log = loom_logging.get("loom.api")

# What a failing store or queue raises. OSError covers refused and reset connections
# and timeouts (asyncio.TimeoutError is TimeoutError, an OSError, since Python 3.11).
BACKEND_ERRORS: tuple[type[Exception], ...] = (ClickHouseError, RedisError, OSError)

BACKEND_MESSAGE = "a backend of the service (store or queue) is unavailable; retry after Retry-After seconds"

_QUERY_STRING = re.compile(r"\?[^\s'\"()]*")

# FastAPI answers these statuses itself; a stable code for each.
_HTTP_CODES = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


def _field(loc: tuple[object, ...]) -> str:
    # Only the first element names where the value came from: a body field may itself
    # be called "query" (the search ops).
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


def safe_detail(exc: BaseException) -> str:
    """The driver's text for the log, without URL query strings: the ClickHouse client
    puts a query's parameters (a search's words, ids) in its URL."""
    return _QUERY_STRING.sub("?...", str(exc))[:500]


def loom_response(exc: LoomError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def is_backend_failure(exc: BaseException) -> bool:
    return isinstance(exc, BACKEND_ERRORS)


def backend_failure(exc: BaseException, path: str) -> JSONResponse:
    """The 503 for a failed backend; the detail is logged, never sent."""
    log.warning("backend failure", path=path, error=type(exc).__name__, detail=safe_detail(exc))
    return loom_response(BackendUnavailable(BACKEND_MESSAGE))


def invalid_body(errors: list[dict[str, Any]]) -> JSONResponse:
    first = errors[0] if errors else {"field": "body", "rule": "invalid"}
    return JSONResponse(
        {
            "error": "invalid_request",
            "message": f"{first['field']}: {first['rule']}",
            "field": first["field"],
            "rule": first["rule"],
            "errors": errors,
        },
        status_code=422,
    )


OP_PREFIX = "/v1/"


def is_json(content_type: str | None) -> bool:
    """application/json or application/<anything>+json (what FastAPI parses as JSON)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _not_json(exc: RequestValidationError) -> JSONResponse | None:
    """The body did not parse: where (line and column), never a character offset
    presented as a field, and never the body's text."""
    cause = exc.__cause__
    if not isinstance(cause, json.JSONDecodeError):
        return None
    rule = f"body is not valid JSON (line {cause.lineno}, column {cause.colno}): {cause.msg}"
    return invalid_body([{"field": "body", "rule": rule, "type": "json_invalid"}])


def _not_an_object(request: Request, exc: RequestValidationError) -> JSONResponse | None:
    """The body parsed (or was taken as bytes) but is no JSON object: say what was sent."""
    found = exc.errors()
    if not found or tuple(found[0]["loc"]) != ("body",) or found[0]["type"] != "model_attributes_type":
        return None
    content_type = request.headers.get("content-type", "")
    if is_json(content_type):
        rule = f"the body must be a JSON object, not {_json_kind(found[0].get('input'))}"
    else:
        rule = (
            f"the body must be a JSON object sent as content-type: application/json "
            f"(this request's content-type is {content_type.split(';', 1)[0] or 'missing'})"
        )
    return invalid_body([{"field": "body", "rule": rule, "type": "model_attributes_type"}])


def _json_kind(value: Any) -> str:
    kinds = ((list, "an array"), (str, "a string"), (bool, "a boolean"), (int | float, "a number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def op_names(app: FastAPI) -> list[str]:
    """Every op the app documents (the `<op>` of each `POST /v1/<op>`; the schema is
    built once and kept by FastAPI)."""
    paths: dict[str, Any] = app.openapi()["paths"]
    return sorted(p.removeprefix(OP_PREFIX) for p in paths if p.startswith(OP_PREFIX))


def _unknown_op(request: Request) -> JSONResponse:
    """404 on /v1: name the op that was asked for and the nearest ones that exist."""
    op = request.url.path.removeprefix(OP_PREFIX)
    near = difflib.get_close_matches(op, op_names(request.app), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}?" if near else "GET /docs lists every op"
    return JSONResponse(
        {
            "error": "not_found",
            "message": f"no op named {op!r} (every op is POST /v1/<op name>); {hint}",
            "field": "op",
            "rule": "unknown_op",
            "suggestions": near,
        },
        status_code=404,
    )


def _wrong_method(request: Request, exc: HTTPException) -> JSONResponse:
    return JSONResponse(
        {
            "error": "method_not_allowed",
            "message": f"{request.method} is not allowed here: every op is POST /v1/<op name> with a JSON body",
            "rule": "post_only",
        },
        status_code=405,
        headers=getattr(exc, "headers", None),
    )


NotFoundPage = Callable[[Request], Awaitable[Response]]


def add_not_found_page(app: FastAPI, prefix: str, render: NotFoundPage) -> None:
    """Paths under `prefix` that match no route answer `render`'s page (the dashboard's
    own 404) instead of the API's JSON."""
    pages: dict[str, NotFoundPage] | None = getattr(app.state, "not_found_pages", None)
    if pages is None:
        pages = app.state.not_found_pages = {}
    pages[prefix.rstrip("/")] = render


def _not_found_page(request: Request) -> NotFoundPage | None:
    pages: dict[str, NotFoundPage] = getattr(request.app.state, "not_found_pages", {})
    path = request.url.path
    return next((r for p, r in pages.items() if path == p or path.startswith(p + "/")), None)


def install(app: FastAPI) -> None:
    @app.exception_handler(LoomError)
    async def loom_error(_: Request, exc: LoomError) -> JSONResponse:
        return loom_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        plain = _not_json(exc) or _not_an_object(request, exc)
        if plain is not None:
            return plain
        return invalid_body(
            [{"field": _field(tuple(e["loc"])), "rule": e["msg"], "type": e["type"]} for e in exc.errors()]
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Any:
        on_ops = request.url.path.startswith(OP_PREFIX)
        if exc.status_code == 404 and on_ops:
            return _unknown_op(request)
        if exc.status_code == 405 and on_ops:
            return _wrong_method(request, exc)
        if exc.status_code == 404 and (page := _not_found_page(request)) is not None:
            return await page(request)
        if isinstance(exc.__cause__, LoomError):
            # Raised while FastAPI read the body (e.g. the gate's 413 on a chunked body).
            return loom_response(exc.__cause__)
        if exc.status_code == 400:
            # FastAPI's "error parsing the body" (e.g. JSON nested past the parser's
            # depth): a body that breaks a rule is a 422 everywhere.
            return invalid_body(
                [
                    {
                        "field": "body",
                        "rule": f"the body is not UTF-8 JSON within the parser's depth ({DEPTH_RULE})",
                        "type": "json_invalid",
                    }
                ]
            )
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    for kind in BACKEND_ERRORS:

        @app.exception_handler(kind)
        async def backend_error(request: Request, exc: Exception) -> JSONResponse:
            return backend_failure(exc, request.url.path)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", path=request.url.path, error=type(exc).__name__, exc_info=exc)
        return JSONResponse(
            {"error": "internal", "message": "internal error; see the server log"}, status_code=500
        )
