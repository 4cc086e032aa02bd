"""The API under uvicorn on a free port, for tests that need a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from loom.api.app import create_app
from loom.services import open_services
from loom.settings import Settings


@contextlib.contextmanager
def serve(settings: Settings) -> Iterator[str]:
    """The API under uvicorn on a free port, in a thread with its own event loop and its
    own services (as `loom serve` runs it, less the supervisor)."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        svc = await open_services(settings, settings.clickhouse_url, settings.redis_url)
        config = uvicorn.Config(create_app(svc), host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        server = uvicorn.Server(config)
        box["server"] = server
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        box["port"] = server.servers[0].sockets[0].getsockname()[1] if server.started else None
        ready.set()
        try:
            await task
        finally:
            await svc.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # a start that failed: said, not hidden behind a timeout
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60) and box.get("port"), f"the API did not start: {box.get('error')!r}"
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        box["server"].should_exit = True
        thread.join(30)


def suite_env(settings: Settings, home: Path, port: int, **extra: str) -> dict[str, str]:
    """The environment of a Loom process (`loom serve`, `loom worker`) started by a test on
    the suite's ClickHouse, Redis and database, with the fake embedder and none of the test
    process's own LOOM_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        LOOM_HOME=str(home),
        LOOM_PORT=str(port),
        LOOM_CLICKHOUSE_URL=settings.clickhouse_url,
        LOOM_CLICKHOUSE_DATABASE=settings.clickhouse_database,
        LOOM_REDIS_URL=settings.redis_url,
        LOOM_EMBEDDER="fake",
        **extra,
    )
    return env
