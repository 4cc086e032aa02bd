"""One process's life, the same for the API and the worker: its services opened, its
live settings followed, its replica registered while it serves; on the way out the
same steps undone in reverse (the replica leaves first, so no one counts a process that
is closing).

The API's lifespan (loom.api.app) and the worker's start-up and shutdown
(workers.main) both go through :func:`running`; each calls :func:`settle` once its own
start-up work is done (the worker loads its model first)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Literal

from loom import memtrace, replicas
from loom.gc_tuning import calm_the_garbage_collector
from loom.ops.platform import live_settings
from loom.services import Services, open_services
from loom.settings import Settings

Kind = Literal["api", "worker"]


@contextlib.asynccontextmanager
async def running(
    settings: Settings, clickhouse_url: str, redis_url: str, kind: Kind
) -> AsyncIterator[Services]:
    svc = await open_services(settings, clickhouse_url, redis_url)
    try:
        await live_settings.follow(svc, kind)
        try:
            async with replicas.serving(svc, kind):
                yield svc
        finally:
            await live_settings.unfollow(svc)
    finally:
        await svc.close()


def settle(settings: Settings, kind: Kind) -> None:
    """Start-up done: what it allocated leaves the collector's reach, and the memory
    trace (LOOM_MEMTRACE) starts."""
    calm_the_garbage_collector()
    memtrace.start(settings, kind)
