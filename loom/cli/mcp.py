"""`loom mcp`: Loom's MCP server over stdio, for MCP clients that start their servers as
processes. A client of the API like the SDK: it calls the ops at LOOM_URL with
LOOM_TOKEN, so the token's role and scopes hold exactly as over HTTP."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from loom.sdk.transport import ENV_TOKEN, ENV_URL


def mcp_stdio(
    toolset: Annotated[
        str, typer.Option(help="core (default) or all (every op, appends included).")
    ] = "core",
    url: Annotated[str | None, typer.Option(help=f"Loom's API (default: {ENV_URL}, else local).")] = None,
    token: Annotated[str | None, typer.Option(help=f"A token (default: {ENV_TOKEN}).")] = None,
) -> None:
    """Serve Loom's tools over MCP on stdin/stdout."""
    from loom.mcp_server.tools import TOOLSETS

    if toolset not in TOOLSETS:
        raise typer.BadParameter("must be core or all", param_hint="--toolset")
    from loom.sdk.transport import LoomError

    try:
        asyncio.run(_serve(toolset, url, token))
    except LoomError as exc:  # no token, most likely: said plainly on stderr
        typer.echo(f"loom mcp: {exc}", err=True)
        raise typer.Exit(2) from None


async def _serve(toolset: Any, url: str | None, token: str | None) -> None:
    from mcp.server.stdio import stdio_server

    from loom.mcp_server import server
    from loom.sdk.transport import Transport
    from loom.settings import load_settings

    transport = Transport(url, token)

    async def call(op: str, body: dict[str, Any], _context: Any) -> dict[str, Any]:
        return await transport.call(op, body, idempotent=False)

    runs = server.Runs(load_settings().mcp_session_run_idle_seconds)
    mcp = server.build(toolset, call, runs, lambda _context: "stdio")  # one process, one session
    try:
        async with stdio_server() as (read, write):
            await mcp.run(read, write, mcp.create_initialization_options())
    finally:
        await transport.aclose()
