"""`/mcp` on the API: MCP over streamable HTTP, behind the API's own bearer tokens.

The endpoint checks the token before anything else (401 with the API's error body, as
every op does), then hands the request to the session manager of the listing the URL
asks for (`?toolset=all`, else core). A tool call is answered by the API itself,
in-process, with the caller's own `Authorization` header: the op's route checks role
and scope and validates the body exactly as for `POST /v1/<op>`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import httpx
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from loom.api import errors
from loom.api.deps import PRINCIPAL, authenticate
from loom.auth import policy
from loom.auth.principal import Principal
from loom.errors import InvalidRequest
from loom.errors import LoomError as ApiError
from loom.mcp_server import server
from loom.mcp_server.tools import TOOLSETS, Toolset
from loom.sdk.transport import error_from

PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"


def _request(context: Any) -> Any:
    return context.request  # the Starlette request the MCP message came in


def _session(context: Any) -> str:
    return str(_request(context).headers.get(SESSION_HEADER, "")) or "no-session"


def _may(context: Any, op: str) -> bool:
    """Whether the caller the endpoint verified may call `op` (loom.auth.policy)."""
    who: Principal | None = _request(context).scope.get(PRINCIPAL)
    return who is not None and policy.rule_for(op).allows(who)


class McpEndpoint:
    """The ASGI app at `/mcp`; `running()` is entered by the API's lifespan."""

    def __init__(self) -> None:
        self.runs = runs = server.Runs(idle_s=1800.0)  # the setting's value once running
        self._client: httpx.AsyncClient | None = None  # to the API itself, made on the first call
        self.managers: dict[Toolset, StreamableHTTPSessionManager] = {
            t: StreamableHTTPSessionManager(app=server.build(t, self._call_api, runs, _session, _may))
            for t in TOOLSETS
        }

    async def _call_api(self, op: str, body: dict[str, Any], context: Any) -> dict[str, Any]:
        """The op's route, in-process, with the MCP caller's own Authorization header."""
        request = _request(context)
        if self._client is None:
            transport = httpx.ASGITransport(app=request.scope["app"])
            self._client = httpx.AsyncClient(transport=transport, base_url="http://loom.mcp", timeout=120)
        auth = {"authorization": request.headers.get("authorization", "")}
        r = await self._client.post(f"/v1/{op}", json=body, headers=auth)
        if r.status_code >= 400:
            raise error_from(r)
        answer: dict[str, Any] = r.json()
        return answer

    @contextlib.asynccontextmanager
    async def running(self, run_idle_seconds: float) -> AsyncIterator[None]:
        self.runs.idle_s = run_idle_seconds
        async with contextlib.AsyncExitStack() as stack:
            for manager in self.managers.values():
                await stack.enter_async_context(manager.run())
            try:
                yield
            finally:
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        svc = scope["app"].state.services
        try:
            scope[PRINCIPAL] = await authenticate(svc, headers.get(b"authorization", b"").decode("latin-1"))
        except ApiError as exc:
            await errors.loom_response(exc)(scope, receive, send)
            return
        except errors.BACKEND_ERRORS as exc:
            await errors.backend_failure(exc, PATH)(scope, receive, send)
            return
        toolset = parse_qs(scope.get("query_string", b"").decode()).get("toolset", ["core"])[-1]
        if toolset not in TOOLSETS:
            bad = InvalidRequest("toolset must be core or all", field="toolset", rule="enum")
            await errors.loom_response(bad)(scope, receive, send)
            return
        # A live setting: read per request, so a change reaches open sessions too.
        self.runs.idle_s = float(svc.settings.mcp_session_run_idle_seconds)
        await self.managers[toolset].handle_request(scope, receive, send)
