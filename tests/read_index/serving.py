"""The read index's process, run in the test's own event loop on the suite's backends,
and a Services that searches through it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from loom.read_index.server import IndexServer


@contextlib.asynccontextmanager
async def index_server(services: Any, path: Path, budget_mb: int = 256) -> AsyncIterator[IndexServer]:
    redis = Redis.from_url(services.settings.redis_url)
    server = IndexServer(services.ch, redis, budget_mb * 1024 * 1024)
    listening = await server.serve(path)
    await server.start()
    try:
        yield server
    finally:
        listening.close()
        await server.close()
        await redis.aclose()


@contextlib.contextmanager
def searching_through(services: Any, path: Path) -> Any:
    """`services` searches through the index at `path` while the block runs."""
    before = services.settings
    services.settings = before.model_copy(update={"read_index_socket": str(path)})
    try:
        yield services
    finally:
        services.settings = before


async def loaded(server: IndexServer) -> None:
    """Wait until the namespaces listed at start are loaded."""
    import asyncio

    while server.index.queue or server.index.loading:
        await asyncio.sleep(0.02)
