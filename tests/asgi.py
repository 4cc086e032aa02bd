"""The API in-process over ASGI, for tests and benches that need no real port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx


@asynccontextmanager
async def in_process(
    app: Any, base_url: str = "http://loom.test", timeout: float = 60
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` over ASGI, its lifespan held by a task of its own: entered and
    left in that one task, as a server does (the MCP session managers' task groups
    require it), whichever task or fixture finalizer ends the client."""
    up, down = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with app.router.lifespan_context(app):
            up.set()
            await down.wait()

    holder = asyncio.create_task(hold())
    waiting = asyncio.create_task(up.wait())
    await asyncio.wait([holder, waiting], return_when=asyncio.FIRST_COMPLETED)
    if holder.done():  # the lifespan failed to start: say why
        waiting.cancel()
        holder.result()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=timeout
        ) as client:
            yield client
    finally:
        down.set()
        await holder
