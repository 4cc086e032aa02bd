"""FastAPI dependencies: the services handle and the caller's verified principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from loom.auth import policy, tokens
from loom.auth.principal import Principal
from loom.errors import Unauthorized
from loom.models.errors import COMMON, error_responses
from loom.services import Services

OP_PREFIX = "/v1/"
PRINCIPAL = "loom.principal"  # the scope key of the caller the gate (loom.api.gate) verified


def op_router(tag: str) -> APIRouter:
    """The router of a group of ops: under /v1, in the docs' section `tag`, each op
    answering the errors every op may answer."""
    return APIRouter(prefix=OP_PREFIX.rstrip("/"), tags=[tag], responses=error_responses(*COMMON))


bearer = HTTPBearer(auto_error=False, description="A token from `loom token mint`.")


async def services(request: Request) -> Services:
    # async: a sync dependency costs a thread hop on every request
    found: Services = request.app.state.services
    return found


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
        raise Unauthorized("invalid, revoked or expired token")
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


def op_of(request: Request) -> str:
    """The op a request calls: its route's path under /v1 (`/v1/memory.set` -> `memory.set`)."""
    route = request.scope.get("route")
    path: str = getattr(route, "path", "") or request.url.path
    return path.removeprefix(OP_PREFIX)


async def authorized(
    request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal:
    """The caller, once loom.auth.policy allows it this op: the one authorization check of
    every op (HTTP, MCP and dashboard alike), before the body is touched.

    It resolves the bearer credentials itself instead of depending on `principal`:
    every level of dependencies costs FastAPI's resolver a few tens of microseconds per
    request, on the API's one event loop.
    """
    who = await principal(request, creds)
    policy.check(op_of(request), who)
    return who


# Named once (FastAPI's Annotated style): a route declares `who: Caller, svc: Svc`.
Caller = Annotated[Principal, Depends(authorized)]
Svc = Annotated[Services, Depends(services)]
