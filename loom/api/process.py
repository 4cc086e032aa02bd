"""The API process `loom serve` starts: `python -m loom.api.process --host H --port P`.

uvicorn as its command line would run it (httptools and uvloop; its lines through Loom's
log setup, led by their time; a request line each only with LOOM_LOG_VERBOSE), with a
bound on answering the requests in flight once told to stop (SIGTERM/SIGINT), and no
interpreter teardown after that: tearing down the API's modules took seconds on a busy
machine, and the supervisor waits for this process to exit before it stops the workers.
With `--await-start` it imports the app, then waits for the backends' URLs on its
standard input (loom.start_gate).
"""

from __future__ import annotations

import argparse
import os
import sys

import uvicorn

from loom import logging as loom_logging
from loom import start_gate
from loom.settings import load_settings

STARTUP_FAILURE = 3  # uvicorn's own exit code when the app did not start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loom.api.process")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--drain-seconds", type=int, default=5, help="bound on answering in-flight requests")
    parser.add_argument(start_gate.FLAG, action="store_true", help="wait for the backends' URLs on stdin")
    args = parser.parse_args(argv)
    from loom.api.main import app  # the imports that overlap the backends' start

    if args.await_start:
        start_gate.await_start()
    settings = load_settings()
    loom_logging.configure(settings.log_level, verbose=settings.log_verbose)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        access_log=settings.log_verbose,
        log_config=None,  # uvicorn's lines go through Loom's handler (with their time)
        log_level="info" if settings.log_verbose else "warning",
        timeout_graceful_shutdown=args.drain_seconds,
    )
    server = uvicorn.Server(config)
    server.run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if server.started else STARTUP_FAILURE)


if __name__ == "__main__":
    main()
