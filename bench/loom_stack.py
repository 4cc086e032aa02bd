"""Loom's whole embedded stack for the benchmarks, started as ``loom serve`` starts it.

``LoomStack(home).start()`` runs ``python -m loom.cli.main serve --workers 1`` with a private
``LOOM_HOME`` (the embedded ClickHouse endpoint over chdb, the embedded redis-server, the
schema migrations, one arq worker with the configured embedder, the API under uvicorn), waits
for ``/healthz`` and then finds the endpoint's and Redis's URLs under that home, so a
benchmark can bulk-load straight into the store the API reads.

Teardown: :meth:`stop` sends ``loom serve`` SIGTERM (it stops its children and backends in
order) and, if something outlives it, SIGKILLs every process of the stack it recorded at
start (``loom serve`` runs in a session of its own, so a Ctrl-C in the terminal reaches only
the benchmark, which then calls :meth:`stop`; redis-server is in yet another session, hence
the recorded pids). :meth:`pause`/:meth:`resume` freeze and thaw the whole stack
(SIGSTOP/SIGCONT), so it costs no CPU while another system is measured.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (Linux)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs)."""
    tree = _children()
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        for c in tree.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): a pid plus its
    start time names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


class LoomStack:
    """``loom serve`` in a temporary (or given) LOOM_HOME on a free port."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        port: int | None = None,
        embedder: str = "minilm",
        workers: int = 1,
        env: dict[str, str] | None = None,
        keep: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.own_home = home is None
        self.cwd = cwd or REPO  # the checkout whose code runs (bench/ab_bench.py: another build)
        self.home = home or Path(tempfile.mkdtemp(prefix="loom-bench-home-"))
        self.port = port or free_port()
        self.embedder = embedder
        self.workers = workers
        self.extra_env = env or {}
        self.keep = keep
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.log_path = self.home / "serve.log"
        self.clickhouse_url = ""
        self.redis_url = ""
        self.pids: dict[int, str | None] = {}  # every process of the stack -> its start time
        self.paused = False
        self.healthy_after_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log: Callable[[str], None] = print, timeout: float = 240.0, poll_s: float = 0.2) -> None:
        """Start `loom serve` and wait for /healthz (polled every `poll_s`); the time it took
        is then :attr:`healthy_after_s`."""
        from loom.embedded.backends import clickhouse_dir, redis_dir
        from loom.embedded.clickhouse_endpoint import find_running_endpoint
        from loom.embedded.redis_server import find_running_redis
        from loom.settings import Settings

        self.env = {
            **os.environ,
            "LOOM_HOME": str(self.home),
            "LOOM_HOST": "127.0.0.1",
            "LOOM_PORT": str(self.port),
            "LOOM_EMBEDDER": self.embedder,
            "LOOM_LOG_LEVEL": "WARNING",
            **self.extra_env,
        }
        for var in ("LOOM_CLICKHOUSE_URL", "LOOM_REDIS_URL"):
            self.env.pop(var, None)  # embedded mode
        self.home.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with self.log_path.open("ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loom.cli.main", "serve", "--workers", str(self.workers)],
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pids[self.proc.pid] = _start_time(self.proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            self._record()
            if self.proc.poll() is not None:
                raise RuntimeError(f"loom serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200:
                    self.healthy_after_s = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Loom's API did not come up in {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(poll_s)
        fake = Settings(home=self.home)
        ch = find_running_endpoint(clickhouse_dir(fake))
        rd = find_running_redis(redis_dir(fake))
        if not ch or not rd:
            raise RuntimeError(f"Loom is up but its backends were not found under {self.home}")
        self.clickhouse_url, self.redis_url = ch, rd
        # The worker loads its model after /healthz answers; record its processes too.
        time.sleep(0.5)
        self._record()
        log(
            f"  loom: stack up in {time.monotonic() - t0:.1f}s (LOOM_HOME={self.home}, API {self.base_url}, "
            f"ClickHouse endpoint {ch}, {len(self.pids)} processes)"
        )

    def _record(self) -> None:
        if self.proc is None:
            return
        for pid in descendants(self.proc.pid):
            if pid not in self.pids:
                self.pids[pid] = _start_time(pid)

    def _alive(self) -> list[int]:
        return [p for p, st in self.pids.items() if st is not None and _start_time(p) == st]

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _signal_all(self, sig: int) -> None:
        for pid in self._alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """Freeze every process of the stack (no CPU while another system is measured)."""
        if self.proc is not None and not self.paused:
            self._record()
            self._signal_all(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self._signal_all(signal.SIGCONT)
            self.paused = False

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to ``loom serve`` (which stops the rest), then SIGKILL to whatever is left.
        Idempotent; deletes a temporary home."""
        proc, self.proc = self.proc, None
        if proc is not None:
            self._record_from(proc.pid)
            self.paused = True
            self.resume()
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout)
            deadline = time.monotonic() + 10
            while self._alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            self._signal_all(signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if self.own_home and not self.keep:
            shutil.rmtree(self.home, ignore_errors=True)

    def _record_from(self, pid: int) -> None:
        for p in descendants(pid):
            if p not in self.pids:
                self.pids[p] = _start_time(p)
