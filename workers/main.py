"""The arq worker process (`loom worker`): runs every background job.

Jobs run concurrently in one event loop (max_jobs), so the embedder can batch the
texts of many concurrent jobs into one model call.
"""

from __future__ import annotations

from typing import Any

from arq.worker import Worker

from loom import logging as loom_logging
from loom.services import open_services, redis_settings
from loom.settings import Settings
from workers import embedding
from workers.jobs import FUNCTIONS

QUEUE = "loom:queue"


def _startup(settings: Settings, clickhouse_url: str, redis_url: str) -> Any:
    async def on_startup(ctx: dict[str, Any]) -> None:
        ctx["loom"] = await open_services(settings, clickhouse_url, redis_url)
        for hook in STARTUP_HOOKS:
            await hook(ctx)

    return on_startup


async def _shutdown(ctx: dict[str, Any]) -> None:
    for hook in SHUTDOWN_HOOKS:
        await hook(ctx)
    if "loom" in ctx:
        await ctx["loom"].close()


# Planes register per-process resources here (the embedder, write buffers).
STARTUP_HOOKS: list[Any] = [embedding.startup]
SHUTDOWN_HOOKS: list[Any] = [embedding.shutdown]


def build_worker(settings: Settings, clickhouse_url: str, redis_url: str, **overrides: Any) -> Worker:
    options: dict[str, Any] = dict(
        functions=FUNCTIONS,
        queue_name=QUEUE,
        redis_settings=redis_settings(redis_url),
        on_startup=_startup(settings, clickhouse_url, redis_url),
        on_shutdown=_shutdown,
        max_jobs=256,
        # The API awaits job results, so queue pick-up latency is append latency; but
        # every poll is a Redis round trip: at 2 ms an idle worker took ~9% of a core
        # (and Redis some more), CPU the model then lacks. 5 ms: ~6%, +1.5 ms pick-up.
        poll_delay=0.005,
        job_timeout=300,
        keep_result=60,
        handle_signals=True,
    )
    options.update(overrides)
    return Worker(**options)


def run_worker(settings: Settings, clickhouse_url: str, redis_url: str) -> None:
    loom_logging.configure(settings.log_level)
    build_worker(settings, clickhouse_url, redis_url).run()
