"""Every error leaves the API as JSON with a stable `error` code; bad input is a 4xx."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from loom.errors import LoomError

log = logging.getLogger("loom.api")


def _field(loc: tuple[object, ...]) -> str:
    # Only the first element names where the value came from: a body field may itself
    # be called "query" (the search ops).
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(LoomError)
    async def loom_error(_: Request, exc: LoomError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field(tuple(e["loc"])), "rule": e["msg"], "type": e["type"]} for e in exc.errors()]
        first = errors[0] if errors else {"field": "body", "rule": "invalid"}
        return JSONResponse({"error": "invalid_request", "message": f"{first['field']}: {first['rule']}",
                             "field": first["field"], "rule": first["rule"], "errors": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error")
        return JSONResponse({"error": code, "message": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"path": request.url.path})
        return JSONResponse({"error": "internal", "message": "internal error; see the server log"},
                            status_code=500)
