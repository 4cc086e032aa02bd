"""`python -m loom.read_index.process`: the read index's process, as `loom serve` runs it.

With ``--await-start`` it waits for the backends' URLs on its standard input
(loom.start_gate), like the API and the workers. It listens on ``--socket`` (the API is
told the same path in LOOM_READ_INDEX_SOCKET) and stops on SIGTERM or SIGINT; a killed
index costs searches nothing but speed (they read the engine until it is back).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from pathlib import Path

from redis.asyncio import Redis

from loom import logging as loom_logging
from loom import start_gate
from loom.read_index.server import IndexServer
from loom.settings import load_settings
from loom.store.clickhouse import connect


async def run(socket_path: Path) -> None:
    settings = load_settings()
    loom_logging.configure(settings.log_level)
    ch = connect(
        settings.clickhouse_url,
        database=settings.clickhouse_database,
        user=settings.clickhouse_user,
        password=settings.clickhouse_password,
    )
    redis = Redis.from_url(settings.redis_url)
    server = IndexServer(ch, redis, settings.read_index_mb * 1024 * 1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listening = await server.serve(socket_path)
    await server.start()
    try:
        await stop.wait()
    finally:
        listening.close()
        await server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        await redis.aclose()
        ch.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loom.read_index.process")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument(start_gate.FLAG, action="store_true", help="wait for the backends' URLs on stdin")
    args = parser.parse_args(argv)
    if args.await_start:
        start_gate.await_start()
    asyncio.run(run(args.socket))


if __name__ == "__main__":
    main()
