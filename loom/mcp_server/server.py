"""The MCP protocol server over Loom's tools: list them, call one as its op.

How an op is reached is the transport's business (a `Caller`): over HTTP the API
itself, in-process, with the MCP caller's own bearer token (the same roles, scopes and
validation as `POST /v1/<op>`: no second path to the data); over stdio the API at
LOOM_URL with LOOM_TOKEN. An op's refusal comes back as a tool error carrying the API's
error body.

Runs: each MCP session has an implicit run that its writes join (`run_id`, unless the
call names one). After LOOM_MCP_SESSION_RUN_IDLE_SECONDS without a call the run is
closed: the session's next write starts a new one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server

from loom.mcp_server.tools import Toolset, ToolSpec, find, listed
from loom.sdk.transport import LoomError

# (op, body, the MCP request's context) -> the op's JSON answer; LoomError on a refusal.
Caller = Callable[[str, dict[str, Any], Any], Awaitable[dict[str, Any]]]
# The MCP request's context -> the key of its session (for its run).
SessionKey = Callable[[Any], str]
# (the MCP request's context, op) -> whether the caller may call it (loom.auth.policy):
# the listing shows only the tools its token may call.
May = Callable[[Any, str], bool]


def may_call_any(_context: Any, _op: str) -> bool:
    """For a transport that cannot see the caller: the API refuses what it must."""
    return True


@dataclass
class Runs:
    """Each session's current run; a run idle longer than `idle_s` is closed."""

    idle_s: float
    _runs: dict[str, tuple[str, float]] = field(default_factory=dict)

    def current(self, session: str) -> str:
        now = time.monotonic()
        run = self._runs.get(session)
        if run is None or now - run[1] > self.idle_s:
            run = (f"mcp-{uuid.uuid4().hex[:16]}", now)
        self._runs[session] = (run[0], now)
        self._forget_closed(now)
        return run[0]

    def touch(self, session: str) -> None:
        """A call of the session just ended: its run's idle time starts now."""
        run = self._runs.get(session)
        if run is not None:
            self._runs[session] = (run[0], time.monotonic())

    def _forget_closed(self, now: float) -> None:
        for key in [k for k, (_, seen) in self._runs.items() if now - seen > self.idle_s]:
            del self._runs[key]


def with_run(spec: ToolSpec, args: dict[str, Any], run_id: str) -> dict[str, Any]:
    """`args` with the session's run where the op takes one and the caller named none."""
    body = dict(args)
    if spec.op == "conversation.append" and isinstance(body.get("turns"), list):
        body["turns"] = [{"run_id": run_id, **t} if isinstance(t, dict) else t for t in body["turns"]]
    elif "run_id" in spec.request.model_fields:
        body.setdefault("run_id", run_id)
    return body


def build(
    toolset: Toolset, call: Caller, runs: Runs, session_key: SessionKey, may: May = may_call_any
) -> Server[Any, Any]:
    server: Server[Any, Any] = Server("loom", instructions="Loom: durable memory, session briefs and search.")

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]  # the MCP SDK's decorators are untyped
    async def list_tools() -> list[types.Tool]:
        context = server.request_context
        return [
            types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema())
            for t in listed(toolset)
            if may(context, t.op)
        ]

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]  # the MCP SDK's decorators are untyped
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        spec = find(toolset, name)
        if spec is None:
            return _error({"error": "not_found", "message": f"no tool {name} in the {toolset} listing"})
        context = server.request_context
        session = session_key(context)
        body = with_run(spec, arguments or {}, runs.current(session)) if spec.takes_run else arguments
        try:
            answer = await call(spec.op, body or {}, context)
        except LoomError as exc:
            return _error({"error": exc.error, "message": exc.message, "field": exc.field, "rule": exc.rule})
        finally:
            runs.touch(session)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(answer))], structuredContent=answer
        )

    return server


def _error(body: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body))], isError=True)
