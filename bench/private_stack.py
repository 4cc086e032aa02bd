"""A private Loom backend for in-process benches: an embedded ClickHouse endpoint and
Redis in a temporary home, the schema prepared, the ops' services open.

    async with private_services("loomwh-", "loom_webhook_bench") as svc:
        ...  # call ops with svc; svc.settings names the endpoint and Redis
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from loom.embedded.clickhouse_endpoint import start_endpoint
from loom.embedded.redis_server import start_redis
from loom.services import Services, open_services
from loom.settings import Settings
from loom.store.schema import prepare


@contextlib.asynccontextmanager
async def private_services(prefix: str, database: str, *, embedder: str = "fake") -> AsyncIterator[Services]:
    home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    endpoint = start_endpoint(home / "clickhouse")
    redis = start_redis(home / "redis")
    try:
        settings = Settings(
            home=home,
            clickhouse_url=endpoint.url,
            redis_url=redis.url,
            embedder=embedder,
            clickhouse_database=database,
        )
        prepare(settings, settings.clickhouse_url)
        svc = await open_services(settings, settings.clickhouse_url, settings.redis_url)
        try:
            yield svc
        finally:
            await svc.close()
    finally:
        redis.stop()
        endpoint.stop()
