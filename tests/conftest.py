"""The suite's real backends: one embedded ClickHouse endpoint and one redis-server,
started once per session on free ports in a temporary directory (or the servers named
by LOOM_TEST_CLICKHOUSE_URL / LOOM_TEST_REDIS_URL). Each test gets its own namespace;
the session gets its own database."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loom.settings import Settings


@pytest.fixture(scope="session")
def tmp_home() -> Iterator[Path]:
    # Short path: the redis unix socket path must stay under ~100 characters.
    path = Path(tempfile.mkdtemp(prefix="loomt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def backend_urls(tmp_home: Path) -> Iterator[tuple[str, str]]:
    from loom.embedded.clickhouse_endpoint import start_endpoint
    from loom.embedded.redis_server import start_redis

    ch_url = os.environ.get("LOOM_TEST_CLICKHOUSE_URL", "")
    redis_url = os.environ.get("LOOM_TEST_REDIS_URL", "")
    # An ExitStack stops every server started even if stopping one of them fails.
    with contextlib.ExitStack() as started:
        if not ch_url:
            endpoint = start_endpoint(tmp_home / "clickhouse", die_with_parent=True)
            started.callback(endpoint.stop)
            ch_url = endpoint.url
        if not redis_url:
            server = start_redis(tmp_home / "redis", die_with_parent=True)
            started.callback(server.stop)
            redis_url = server.url
        yield ch_url, redis_url


@pytest.fixture(scope="session")
def settings(tmp_home: Path, backend_urls: tuple[str, str]) -> Settings:
    ch_url, redis_url = backend_urls
    return Settings(
        home=tmp_home,
        clickhouse_url=ch_url,
        redis_url=redis_url,
        clickhouse_database=f"loom_test_{secrets.token_hex(4)}",
        embedder="fake",
        write_batch_max_wait_ms=1.0,
        embed_wait_seconds=5.0,
    )


@pytest.fixture(scope="session")
def schema(settings: Settings) -> Iterator[Settings]:
    from loom.store.clickhouse import connect
    from loom.store.schema import prepare

    prepare(settings, settings.clickhouse_url)
    yield settings
    if os.environ.get("LOOM_TEST_CLICKHOUSE_URL"):
        with contextlib.suppress(Exception):
            connect(settings.clickhouse_url, database="default").command(
                f"DROP DATABASE IF EXISTS {settings.clickhouse_database}"
            )


@pytest.fixture(scope="session")
async def services(schema: Settings) -> AsyncIterator[Any]:
    from loom.services import open_services

    svc = await open_services(schema, schema.clickhouse_url, schema.redis_url)
    for hook in SERVICE_HOOKS:
        await hook(svc)
    yield svc
    await svc.close()


# Planes add per-process setup (e.g. the fake embedder) through conftest plugins.
SERVICE_HOOKS: list[Callable[[Any], Awaitable[None]]] = []


@pytest.fixture(scope="session")
async def api(services: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process over ASGI, on the real backends."""
    from loom.api.app import create_app
    from tests.asgi import in_process

    async with in_process(create_app(services)) as client:
        yield client


@pytest.fixture(scope="session")
def api_url(schema: Settings) -> Iterator[str]:
    """The API under uvicorn on a real port (its own thread, loop and services), for
    clients that speak HTTP: the SDK, the CLI, the capture hooks. Jobs it enqueues run on
    the `arq_worker` fixture's worker (an async test keeps that loop running)."""
    from tests.platform.served import serve

    with serve(schema) as url:
        yield url


@pytest.fixture(scope="session")
def served(schema: Settings) -> Iterator[str]:
    """`loom serve` itself on the suite's backends and database (one process for the
    session: the dashboard's browser tests and the TypeScript client's tests share it)."""
    from tests.platform.served import loom_serve

    with loom_serve(schema) as url:
        yield url


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"t{secrets.token_hex(6)}"


Mint = Callable[..., str]


@pytest.fixture
def mint(services: Any) -> Mint:
    """mint(namespaces or ns, role, read_scope="all", read_user_id="") -> bearer token."""
    from loom.auth.tokens import mint as mint_token

    def _mint(
        namespaces: str | list[str],
        role: str = "admin",
        read_scope: str = "all",
        read_user_id: str = "",
        read_session_id: str = "",
    ) -> str:
        names = [namespaces] if isinstance(namespaces, str) else namespaces
        return mint_token(services.ch, names, role, read_scope, read_user_id, read_session_id).token

    return _mint


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def call(api: httpx.AsyncClient) -> Callable[..., Awaitable[httpx.Response]]:
    """call(op, token, **body) -> response of POST /v1/<op>."""

    async def _call(op: str, token: str | None, **body: Any) -> httpx.Response:
        headers = bearer(token) if token else {}
        return await api.post(f"/v1/{op}", json=body, headers=headers)

    return _call


@pytest.fixture(scope="session")
async def arq_worker(services: Any) -> AsyncIterator[Any]:
    """A real arq worker (the production build_worker) running in the test process as
    an asyncio task, on the session's backends. Its embedder is the fake (settings say
    so); tests swap it with the `worker_embedder` fixture."""
    import asyncio

    from workers import embed_jobs
    from workers.main import build_worker

    settings: Settings = services.settings
    embed_jobs.set_embedder(None)  # built from settings (the fake) at start-up
    # No cron jobs: the embedding recovery pass would call whatever embedder a test has
    # swapped in at that moment; its tests run it themselves (tests/embedding/test_recovery.py).
    worker = build_worker(
        settings, settings.clickhouse_url, settings.redis_url, handle_signals=False, burst=False, cron_jobs=[]
    )
    task = asyncio.create_task(worker.async_run())
    for _ in range(1000):  # until its start-up hooks ran (the embedder is in place)
        if embed_jobs.PIPELINE in worker.ctx or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    yield worker
    # A job still running at the end of the session is cancelled by close(); its
    # CancelledError is the expected end of that job, not a failure of the last test.
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await worker.close()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    embed_jobs.set_embedder(None)


@pytest.fixture
async def worker_embedder(arq_worker: Any) -> AsyncIterator[Callable[[Any], Any]]:
    """install(embedder) -> embedder: swap the worker's embedder for this test (a
    failing, slow or spying one); the fake from settings comes back afterwards."""
    from workers import embed_jobs

    original = embed_jobs.current_embedder()

    def install(embedder: Any) -> Any:
        embed_jobs.set_embedder(embedder)
        return embedder

    yield install
    embed_jobs.set_embedder(original)


@pytest.fixture
def fake_embedder() -> Any:
    """A fresh deterministic fake embedder (the suite's settings name `embedder="fake"`)."""
    from loom.providers.embedders import FakeEmbedder

    return FakeEmbedder()


@pytest.fixture
async def leak_spy(services: Any, arq_worker: Any) -> AsyncIterator[Any]:
    """Every provider (tests/leaks.py PROVIDERS: the embedders, the LLMs) wrapped in a spy
    for this test; the test fails if any was sent text that reads as high."""
    from tests.leaks import Env, LeakSpy, install_all

    spy = LeakSpy()
    undo = install_all(Env(services, arq_worker.ctx.get("loom")), spy)
    try:
        yield spy
    finally:
        for step in reversed(undo):
            step()
    spy.assert_clean()
