"""FastAPI dependencies: the services handle and the caller's verified principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from loom.auth import tokens
from loom.auth.principal import Principal, Role
from loom.errors import Forbidden, Unauthorized
from loom.services import Services

bearer = HTTPBearer(auto_error=False, description="A token from `loom token mint`.")


async def services(request: Request) -> Services:
    # async: a sync dependency costs a thread hop on every request
    return request.app.state.services  # type: ignore[no-any-return]


async def principal(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
    if creds is None or creds.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer loom_...)")
    # A token verified within the cache TTL needs no I/O: no thread hop on the hot path.
    hit, who = tokens.cached(creds.credentials)
    if not hit:
        svc: Services = request.app.state.services
        who = await svc.run(tokens.verify, svc.ch, creds.credentials)
    if who is None:
        raise Unauthorized("invalid or revoked token")
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

    async def dep(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
        who = await principal(request, creds)
        who.require_role(role)
        if who.bounded:
            if bounded == "refuse":
                raise Forbidden("a token bound to one user or session cannot call this op", rule="read_scope")
            if bounded == "user" and who.read_scope != "own_user":
                raise Forbidden("an own_session token cannot call this op: conversation rows have no session",
                                rule="read_scope")
        return who

    return dep
