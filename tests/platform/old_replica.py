"""A process of an older build, for the rolling-upgrade tests: it registers as a live
replica with the schema and capabilities given, heartbeats, and deregisters on SIGTERM.

    python -m tests.platform.old_replica REDIS_URL SCHEMA [CAPABILITY ...]
"""

from __future__ import annotations

import asyncio
import signal
import sys

from redis.asyncio import Redis

from loom import replicas


async def main(redis_url: str, schema: int, capabilities: list[str]) -> None:
    redis = Redis.from_url(redis_url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    me = replicas.this_process("api-old", schema, capabilities)
    async with replicas.registered(redis, me):
        print(me.replica_id, flush=True)
        await stop.wait()
    await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
