"""The errors every op may raise; the API turns each into JSON with a stable `error` code."""

from __future__ import annotations

from typing import Any


class LoomError(Exception):
    status = 422
    code = "invalid_request"
    retry_after: int | None = None  # seconds, sent as Retry-After (the 503s)

    def __init__(self, message: str, *, field: str | None = None, rule: str | None = None, **extra: Any):
        super().__init__(message)
        self.message = message
        self.field = field
        self.rule = rule
        self.extra = extra

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field:
            out["field"] = self.field
        if self.rule:
            out["rule"] = self.rule
        out.update(self.extra)
        return out


class InvalidRequest(LoomError):
    """A body that breaks a rule: 422, like a body that fails its model's validation."""

    status, code = 422, "invalid_request"


class ConflictingFields(InvalidRequest):
    """Fields each valid alone that contradict each other: a 422 like any body that
    fails validation, whose `fields` names all of them (`field` the first)."""

    def __init__(self, message: str, *, fields: list[str], rule: str):
        super().__init__(message, field=fields[0], rule=rule, fields=fields)


class Unauthorized(LoomError):
    status, code = 401, "unauthorized"


class Forbidden(LoomError):
    status, code = 403, "forbidden"


class NotFound(LoomError):
    status, code = 404, "not_found"


class Conflict(LoomError):
    status, code = 409, "conflict"


class Unavailable(LoomError):
    """Retry later: a dependency (model, store) could not do the work this time."""

    status, code = 503, "unavailable"
    retry_after = 1


class BackendUnavailable(Unavailable):
    """ClickHouse or Redis failed (down, unreachable, timed out, or erred): the client
    sees this stable code and a safe message; the driver's text (which can carry the
    internal URL and another namespace's query parameters) goes to the server log only."""

    code = "backend_unavailable"
    retry_after = 5


class CapabilityMissing(Unavailable):
    """A live replica of a rolling deploy lacks what the op relies on: retry once the
    deploy has rolled (loom.replicas)."""

    code = "replica_lacks_capability"
    retry_after = 15


class BodyTooLarge(LoomError):
    status, code = 413, "body_too_large"
