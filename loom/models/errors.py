"""The body of every error answer, as OpenAPI documents it for each route."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorItem(BaseModel):
    field: str
    rule: str
    type: str


class ErrorBody(BaseModel):
    """`error` is a stable code; `message` is safe to show (never a driver's text)."""

    model_config = ConfigDict(extra="allow")  # an op may add context (e.g. the current revision)

    error: str = Field(
        description="invalid_request, unauthorized, forbidden, not_found, conflict, body_too_large, "
        "unavailable, backend_unavailable, ..."
    )
    message: str
    field: str | None = Field(None, description="The offending field (dotted path), for bad input.")
    rule: str | None = Field(None, description="The rule it breaks.")
    errors: list[ErrorItem] | None = Field(None, description="Every field that failed validation.")


_WHY = {
    401: "No valid bearer token.",
    403: "The token's role or scope does not allow this op.",
    404: "What the body names does not exist.",
    409: "The stored state is not the one the body expects.",
    413: "The body is larger than LOOM_MAX_BODY_BYTES.",
    422: "The body breaks a rule (the field and the rule are named).",
    503: "A backend or a model could not do the work this time; retry after `Retry-After` seconds.",
}
COMMON = (401, 403, 413, 422, 503)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these statuses, each with the error body."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"model": ErrorBody, "description": _WHY[status]}
        if status == 503:
            out[status]["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
    return out
