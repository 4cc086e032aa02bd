"""Fixtures of the conversation plane's tests: every test here runs against the real
endpoint, Redis and an in-process arq worker (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from loom.providers.llm import OpenAICompatLLM
from tests.providers.standin import StandInServer


@pytest.fixture(scope="session", autouse=True)
async def _conversation_runtime(services: Any, arq_worker: Any) -> AsyncIterator[None]:
    """Every test here needs the worker; the API's append pipeline closes before it."""
    import redis

    from tests.conversation import helpers

    helpers.marks_redis = redis.Redis.from_url(services.settings.redis_url)
    yield
    from loom.ops.conversation import close_pipeline

    await close_pipeline(services)


@pytest.fixture
def recording(services: Any) -> Callable[[str, bool], None]:
    """recording(ns, on=True): the owner's switch, set directly in the store (and its
    cached copy dropped, as the op does: loom.store.recording_cache)."""
    import redis

    from loom.store import namespaces, recording_cache

    client = redis.Redis.from_url(services.settings.redis_url)

    def _set(ns: str, on: bool = True) -> None:
        client.delete(recording_cache.key(ns))
        namespaces.update(services.ch, ns, conversation_logging_enabled=on)

    return _set


@pytest.fixture
def writer(ns: str, mint: Any, recording: Any) -> str:
    """A writer token for a namespace that records."""
    recording(ns, True)
    return str(mint(ns, "writer"))


@pytest.fixture
def other_services(services: Any) -> Callable[..., Any]:
    """other_services(**settings) -> Services sharing the backends but with its own
    per-process state (append buffer, embed client): a second API process."""

    def make(**changes: Any) -> Any:
        cfg = services.settings.model_copy(update=changes) if changes else services.settings
        return dataclasses.replace(services, settings=cfg, extras={})

    return make


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, step: float = 0.02
) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(step)
    return await predicate()


@pytest.fixture
def api_embedder(services: Any) -> Any:
    """install(embedder) -> embedder: swap the API process's inline embedder (search
    queries, saved messages) for this test; the fake from settings comes back after."""
    from loom.ops.embedding import inline

    previous = inline.install(services, None)
    installed: list[Any] = []

    def install(embedder: Any) -> Any:
        inline.install(services, embedder)
        installed.append(embedder)
        return embedder

    yield install
    inline.install(services, previous)


SUMMARY = "They planned the storage cluster migration and agreed on a Friday cutover."


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        srv.set_handler(srv.CHAT, lambda req: srv.chat_ok(SUMMARY))
        yield srv


@pytest.fixture
def summarizer(standin: StandInServer, services: Any, arq_worker: Any) -> Iterator[StandInServer]:
    """The API's and the worker's LLM: the real OpenAI-compatible provider, served by
    the stand-in."""
    worker = arq_worker.ctx["loom"]
    before = services.llm, worker.llm
    llm = OpenAICompatLLM(base_url=standin.url, model="stand-in", timeout=5.0)
    services.llm = worker.llm = llm
    yield standin
    services.llm, worker.llm = before


@pytest.fixture(scope="session")
async def index_server(services: Any, tmp_home: Any) -> AsyncIterator[Any]:
    """The read index's process (in this loop), shared by the session."""
    from tests.read_index.serving import index_server as serving
    from tests.read_index.serving import loaded

    async with serving(services, tmp_home / "read-index.sock") as server:
        await loaded(server)
        yield server


@pytest.fixture
def read_index(services: Any, index_server: Any, tmp_home: Any) -> Iterator[Any]:
    """conversation.search goes through the read index for this test."""
    from tests.read_index.serving import searching_through

    with searching_through(services, tmp_home / "read-index.sock"):
        yield index_server
