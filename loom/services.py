"""The live handles an op needs: ClickHouse, Redis, the arq pool, the LLM, settings.

Built once per process (API or worker) and passed to every op; ops take it as their
first argument so a test can build one against its own backends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, cast

from arq.connections import ArqRedis, RedisSettings, create_pool
from clickhouse_connect.driver.client import Client
from redis.asyncio import Redis

from loom.providers.llm import LLM, build_llm
from loom.read_index import feed
from loom.settings import Settings
from loom.store.clickhouse import connect

T = TypeVar("T")
P = ParamSpec("P")


class Slot(Generic[T]):
    """What one module keeps per process on ``Services.extras`` (a pipeline, a cache,
    a client), under its name, typed: the module reads it through its slot only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, svc: Services) -> T | None:
        return cast(T | None, svc.extras.get(self.name))

    def put(self, svc: Services, value: T) -> T:
        svc.extras[self.name] = value
        return value

    def made(self, svc: Services, make: Callable[[], T]) -> T:
        """The process's value, made on first use."""
        found = self.get(svc)
        return found if found is not None else self.put(svc, make())

    def take(self, svc: Services) -> T | None:
        return cast(T | None, svc.extras.pop(self.name, None))


@dataclass
class Services:
    settings: Settings
    ch: Client
    redis: Redis
    arq: ArqRedis
    llm: LLM
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(64, "loom-io"))
    extras: dict[str, Any] = field(default_factory=dict)  # by Slot (below): per-process state
    # The settings the environment gave this process: `settings` is this with the live
    # overrides an admin stored on top (loom.ops.platform.live_settings), re-applied when they change.
    base_settings: Settings = field(init=False)

    def __post_init__(self) -> None:
        self.base_settings = self.settings

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run blocking I/O (the ClickHouse client is synchronous) off the event loop;
        typed by the function's own parameters, so every store call is checked."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    async def ahead(self, items: Iterator[T]) -> AsyncIterator[T]:
        """The items of a blocking iterator (pages read from the store), each read off the
        event loop while the caller handles the one before: reading and sending an export's
        pages took about as long each, and one after the other an export ran at half the
        speed. At most two items are held at a time."""
        ahead = asyncio.ensure_future(self.run(_step, items))
        try:
            while True:
                got = await ahead
                if got is None:
                    return
                ahead = asyncio.ensure_future(self.run(_step, items))
                yield got[0]
        finally:
            ahead.cancel()

    async def close(self) -> None:
        await self.arq.aclose()
        await self.redis.aclose()
        self.ch.close()
        self.executor.shutdown(wait=False)


def _step(items: Iterator[T]) -> tuple[T] | None:
    """The iterator's next item (in a tuple: an item may be None), or None at its end."""
    for item in items:
        return (item,)
    return None


def llm_from_settings(settings: Settings) -> LLM:
    if settings.llm == "openai":
        return build_llm(
            "openai",
            base_url=settings.llm_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model,
            timeout=settings.llm_timeout_seconds,
        )
    return build_llm("fake")


def redis_settings(url: str) -> RedisSettings:
    return RedisSettings.from_dsn(url)


async def open_services(
    settings: Settings, clickhouse_url: str, redis_url: str, *, llm: LLM | None = None
) -> Services:
    ch = connect(
        clickhouse_url,
        database=settings.clickhouse_database,
        user=settings.clickhouse_user,
        password=settings.clickhouse_password,
    )
    redis = Redis.from_url(redis_url)
    pool = await create_pool(redis_settings(redis_url))
    if settings.read_index_mb > 0:
        feed.attach(redis_url)  # this process's embedding writes reach the read index
    return Services(settings, ch, redis, pool, llm or llm_from_settings(settings))
