"""Finding or starting the backends Loom runs on.

With LOOM_CLICKHOUSE_URL / LOOM_REDIS_URL set, those are used as they are. Without
them, the embedded ClickHouse endpoint and Redis under LOOM_HOME are used: the ones a
running `loom serve` owns if there is one, else ones started here for as long as the
caller needs them (so admin commands work with or without `loom serve`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from loom.embedded.clickhouse_endpoint import find_running_endpoint, start_endpoint
from loom.embedded.redis_server import find_running_redis, start_redis
from loom.settings import Settings


class _Stoppable(Protocol):
    def stop(self, timeout: float = 10.0) -> None: ...


@dataclass
class Backends:
    clickhouse_url: str
    redis_url: str
    started: list[_Stoppable] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.started):
            proc.stop()
        self.started.clear()


def clickhouse_dir(settings: Settings) -> Path:
    return settings.home / "clickhouse"


def redis_dir(settings: Settings) -> Path:
    return settings.home / "redis"


def start_backends(settings: Settings, *, need_redis: bool = True) -> Backends:
    """Resolve both URLs, starting the embedded processes that are needed and not running."""
    backends = Backends(settings.clickhouse_url, settings.redis_url)
    try:
        if not backends.clickhouse_url:
            url = find_running_endpoint(clickhouse_dir(settings))
            if url is None:
                endpoint = start_endpoint(clickhouse_dir(settings))
                backends.started.append(endpoint)
                url = endpoint.url
            backends.clickhouse_url = url
        if need_redis and not backends.redis_url:
            rurl = find_running_redis(redis_dir(settings))
            if rurl is None:
                server = start_redis(redis_dir(settings))
                backends.started.append(server)
                rurl = server.url
            backends.redis_url = rurl
    except BaseException:
        backends.stop()
        raise
    return backends


@contextlib.contextmanager
def backends_for(settings: Settings, *, need_redis: bool = True) -> Iterator[Backends]:
    backends = start_backends(settings, need_redis=need_redis)
    try:
        yield backends
    finally:
        backends.stop()
