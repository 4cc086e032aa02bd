"""One signed-in page view: the token (from the session cookie), who it is, the
namespace the page is about, and a client that calls the API in-process as that token.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request

from loom.api.deps import authenticate
from loom.auth.principal import ME, Principal, Role
from loom.errors import LoomError as ApiError
from loom.sdk.agent import Agent
from loom.sdk.transport import Retry

COOKIE = "loom_dashboard"
PATH = "/dashboard"
# The SDK client's agent name, which it fills into every request that has an `agent`
# field and leaves it out: a page names the agent itself wherever that matters (a thread's
# agent, or "*" for every agent), or it would read and write as an agent "dashboard".
AGENT = "dashboard"
# The ops answer in-process; a refusal shows on the page at once (no retries behind it).
NO_RETRY = Retry(attempts=1)


class SignInNeeded(Exception):
    """No valid token in the cookie: the page answers with the sign-in form."""


class SavedOnly(Exception):
    """An end-user token on a page for namespace-wide tokens: it is sent to the one page
    it sees, its Saved panel."""


@dataclass(frozen=True)
class Visit:
    who: Principal
    namespace: str  # the namespace the page is about ("@me" for an end-user token)
    token: str
    request: Request

    @property
    def end_user(self) -> bool:
        """A token pinned to one user: it sees only its own Saved panel."""
        return self.who.bounded

    def has_user(self, user: str) -> bool:
        """Whether a per-user page has a user to show: an end-user token's own, or `user`."""
        return self.end_user or bool(user)

    def whose(self, user: str) -> dict[str, Any]:
        """The user a per-user op acts for: an end-user token's own (the API knows it, so
        none is sent), else `user`."""
        return {} if self.end_user else {"user_id": user}

    def may(self, role: str) -> bool:
        return not self.end_user and self.who.role >= Role[role]

    @contextlib.asynccontextmanager
    async def api(self) -> AsyncIterator[Agent]:
        """The SDK, pointed at this very app in-process, as the visitor's token."""
        transport = httpx.ASGITransport(app=self.request.app)
        agent = Agent(
            self.namespace,
            "dashboard",
            AGENT,
            base_url="http://loom.dashboard",
            token=self.token,
            retry=NO_RETRY,
            http_transport=transport,
        )
        try:
            yield agent
        finally:
            await agent.aclose()


async def principal_of(request: Request, token: str) -> Principal | None:
    """The token's caller, verified as the API verifies a bearer token; None if it names none."""
    try:
        return await authenticate(request.app.state.services, f"Bearer {token}")
    except ApiError:
        return None


async def open_visit(request: Request, namespace: str | None = None) -> Visit:
    token = request.cookies.get(COOKIE, "")
    who = await principal_of(request, token) if token else None
    if who is None:
        raise SignInNeeded
    return Visit(who, _namespace(who, namespace), token, request)


async def staff_visit(request: Request, namespace: str | None = None) -> Visit:
    """open_visit for a page an end-user token does not see (SavedOnly)."""
    visit = await open_visit(request, namespace)
    if visit.end_user:
        raise SavedOnly
    return visit


def _namespace(who: Principal, asked: str | None) -> str:
    if who.bounded:
        return ME
    if asked and asked in who.namespaces:
        return asked
    return who.namespaces[0] if who.namespaces else ""
