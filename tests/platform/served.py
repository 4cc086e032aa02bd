"""The API on a free port, for tests that need a real HTTP server: under uvicorn in a
thread of the test process (`serve`), or as `loom serve` itself (`loom_serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from loom.api.app import create_app
from loom.services import open_services
from loom.settings import Settings
from tests.faults.harness import free_port


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


@contextlib.contextmanager
def loom_serve(settings: Settings) -> Iterator[str]:
    """`loom serve` as a user runs it, on the suite's backends and database (so tests can
    mint tokens and append through the suite's fixtures); its base URL. With external
    backends it runs no worker: the `arq_worker` fixture's worker serves its jobs while
    an async test runs."""
    home = Path(tempfile.mkdtemp(prefix="loomd-", dir="/tmp"))
    port = free_port()
    env = suite_env(settings, home, port, LOOM_EMBED_WAIT_SECONDS="5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli.main", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, base)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"loom serve exited {proc.returncode}:\n{out[-3000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail("loom serve did not become healthy within 120 s")
