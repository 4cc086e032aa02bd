"""Finding or starting the backends Loom runs on.

With LOOM_CLICKHOUSE_URL / LOOM_REDIS_URL set, those are used as they are. Without
them, the embedded ClickHouse endpoint and Redis under LOOM_HOME are used: the ones a
running `loom serve` owns if there is one, else ones started here for as long as the
caller needs them (so admin commands work with or without `loom serve`). A command
uses a running one without owning it: it never stops what it did not start. What it
starts dies with it (loom.embedded.lifeline), even on a `kill -9`.

`loom serve` owns its backends: before starting them it stops any embedded Redis or
endpoint still running on its home that no live Loom command started (an orphan of
an earlier run), and refuses to start if a live Loom command uses them
(clear_orphans).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from loom.embedded.clickhouse_endpoint import endpoint_pid, find_running_endpoint, start_endpoint
from loom.embedded.redis_server import find_running_redis, redis_pids, start_redis
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
                endpoint = start_endpoint(
                    clickhouse_dir(settings), die_with_parent=True, cache_mb=settings.clickhouse_cache_mb
                )
                backends.started.append(endpoint)
                url = endpoint.url
            backends.clickhouse_url = url
        if need_redis and not backends.redis_url:
            rurl = find_running_redis(redis_dir(settings))
            if rurl is None:
                server = start_redis(redis_dir(settings), die_with_parent=True)
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


class BackendInUse(RuntimeError):
    """An embedded backend on this home belongs to a live Loom command."""


ORPHAN_STOP_TIMEOUT_S = 10.0


def running_backends(settings: Settings) -> list[tuple[str, int]]:
    """(name, pid) of each embedded backend process running on this home."""
    found: list[tuple[str, int]] = []
    if settings.clickhouse_embedded and (pid := endpoint_pid(clickhouse_dir(settings))) is not None:
        found.append(("clickhouse", pid))
    if settings.redis_embedded:
        found += [("redis", pid) for pid in sorted(redis_pids(redis_dir(settings)))]
    return found


def clear_orphans(settings: Settings, log: Callable[[str], None]) -> None:
    """Stop each embedded backend left running on this home by a Loom process that is
    gone (SIGTERM, SIGKILL after ORPHAN_STOP_TIMEOUT_S), saying so through `log`.
    Raises BackendInUse if a live Loom command (an admin command, a `loom worker`)
    started one: stopping it would break that command."""
    for name, pid in running_backends(settings):
        try:
            proc = psutil.Process(pid)
            parent = proc.parent()
            if parent is not None and parent.pid != 1 and _is_loom_command(parent):
                raise BackendInUse(
                    f"the embedded {name} on {settings.home} (pid {pid}) belongs to a running "
                    f"Loom command (pid {parent.pid}: {' '.join(parent.cmdline())[:120]}); "
                    "stop that first"
                )
            log(
                f"stopping an orphan embedded {name} (pid {pid}) left running on {settings.home} by an earlier run"
            )
            proc.terminate()
            try:
                proc.wait(ORPHAN_STOP_TIMEOUT_S)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        except psutil.NoSuchProcess:
            continue


def _is_loom_command(proc: psutil.Process) -> bool:
    try:
        args = proc.cmdline()
    except psutil.Error:
        return False
    head = [Path(a).name for a in args[:2]]
    return (
        "loom" in head or "loom.cli.main" in args or "loom.api.main:app" in args or "loom.api.process" in args
    )
