"""The worker process `loom serve` starts: ``python -m workers.process``.

What `loom worker` runs, without the command line's own modules (typer, click, the CLI's
subcommands): measured with ``-X importtime``, 33 modules and 2-3 % of a worker's
imports, so a restart saves little; the imports of the worker itself are the bulk.
`loom serve` passes the backends' URLs (LOOM_CLICKHOUSE_URL, LOOM_REDIS_URL), on its
standard input when it starts the worker with `--await-start` (loom.start_gate); without
them, the embedded backends are found (or started) as `loom worker` does.
"""

from __future__ import annotations

import os
import sys

from loom import start_gate
from loom.settings import Settings, load_settings
from workers.main import run_worker


def main() -> None:
    if start_gate.FLAG in sys.argv[1:]:
        start_gate.await_start()
    run(load_settings())


def run(settings: Settings) -> None:
    """Run the worker until stopped, then exit the process (`loom worker` too)."""
    if settings.clickhouse_url and settings.redis_url:
        run_worker(settings, settings.clickhouse_url, settings.redis_url)
    else:
        from loom.embedded.backends import start_backends

        backends = start_backends(settings)
        try:
            run_worker(settings, backends.clickhouse_url, backends.redis_url)
        finally:
            backends.stop()
    # Stopped, jobs finished, buffers flushed: skip the interpreter's teardown of the
    # worker's modules (seconds on a busy machine; `loom serve` waits for this exit).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
