"""FastAPI dependencies: the services handle and the caller's verified principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from loom.auth import tokens
from loom.auth.principal import Principal, Role
from loom.errors import Forbidden, Unauthorized
from loom.services import Services

PRINCIPAL = "loom.principal"  # the scope key of the caller the gate (loom.api.gate) verified

bearer = HTTPBearer(auto_error=False, description="A token from `loom token mint`.")


async def services(request: Request) -> Services:
    # async: a sync dependency costs a thread hop on every request
    return request.app.state.services  # type: ignore[no-any-return]


async def verified(svc: Services, credentials: str | None) -> Principal:
    """The caller a bearer credential names; Unauthorized when it names none. A failing
    token store raises its own error, which the API answers as a 503."""
    if not credentials:
        raise Unauthorized("missing bearer token (Authorization: Bearer loom_...)")
    # A token verified within the cache TTL needs no I/O: no thread hop on the hot path.
    hit, who = tokens.cached(credentials)
    if not hit:
        who = await svc.run(tokens.verify, svc.ch, credentials)
    if who is None:
        raise Unauthorized("invalid or revoked token")
    return who


async def authenticate(svc: Services, authorization: str) -> Principal:
    """The caller of an `Authorization` header's value (parsed as HTTPBearer does)."""
    scheme, credentials = get_authorization_scheme_param(authorization)
    return await verified(svc, credentials if scheme.lower() == "bearer" else None)


async def principal(
    request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal:
    # The gate (loom.api.gate) verified the token before the body was read.
    who: Principal | None = request.scope.get(PRINCIPAL)
    if who is None:
        svc: Services = request.app.state.services
        who = await verified(
            svc, creds.credentials if creds is not None and creds.scheme.lower() == "bearer" else None
        )
    request.state.token_id = who.token_id
    return who


def require(role: Role, *, bounded: str = "refuse") -> Callable[..., Awaitable[Principal]]:
    """Role and scope, checked before the body is touched.

    `bounded` says what a token pinned to one user/session may do here: "refuse" (the
    conversation ops: a thread has no user axis to bound), "user" (the saved-message
    ops: own_user tokens act as their user, own_session tokens are refused), or "any"
    (session briefs, which key bounded tokens' briefs by user and session).

    The dependency resolves the bearer credentials itself instead of depending on
    `principal`: every level of dependencies costs FastAPI's resolver a few tens of
    microseconds per request, on the API's one event loop.
    """

    async def dep(
        request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> Principal:
        who = await principal(request, creds)
        who.require_role(role)
        if who.bounded:
            if bounded == "refuse":
                raise Forbidden("a token bound to one user or session cannot call this op", rule="read_scope")
            if bounded == "user" and who.read_scope != "own_user":
                raise Forbidden(
                    "an own_session token cannot call this op: conversation rows have no session",
                    rule="read_scope",
                )
        return who

    return dep
