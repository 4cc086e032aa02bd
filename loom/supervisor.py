"""`loom serve`'s supervisor: starts the processes Loom runs as, keeps them running,
stops them in order.

Children: the embedded ClickHouse endpoint and the embedded Redis (when embedded), the
arq workers, the read index (loom.read_index, unless LOOM_READ_INDEX_MB is 0) and the
API (uvicorn). The workers and the API are started first and import
their modules while the backends start and the schema is migrated; then they are told
the backends' URLs and go on (loom.start_gate).

Restarts. A child that exits while Loom is not stopping is started again after a delay
that doubles from 0.2 s up to 5 s, and falls back to 0.2 s once the child has stayed up
10 s. Everything else keeps serving meanwhile (the API answers 503 while a backend is
down). A child that fails 5 times within 60 s is given up on: everything is stopped
and `loom serve` exits 1 naming it. A restarted backend keeps its URL (the same unix
socket, the same port), so the API and the workers reconnect to it on their own; a
worker that dies with Redis is restarted like any other child.

Stopping (SIGINT, SIGTERM, SIGHUP): the API first (uvicorn stops accepting and answers
what is in flight; appends among them wait for their embedding, so the workers still
run), then the workers (arq finishes its running jobs and takes no new one), then the
backends. Each step has a bound, after which the step's processes are killed.
Children run in sessions of their own, so a terminal's Ctrl-C reaches the supervisor
only and this order holds; each has a parent-death signal (loom.embedded.lifeline), so
a `kill -9` of the supervisor stops them too.

One `loom serve` per home: it holds HOME/serve.lock while it runs, and before starting
the backends it stops any left running on the home by an earlier run
(loom.embedded.backends.clear_orphans).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loom import logging as loom_logging
from loom import start_gate
from loom.embedded import clickhouse_endpoint, redis_server
from loom.embedded.backends import clear_orphans, clickhouse_dir, redis_dir
from loom.embedded.lifeline import die_with_parent
from loom.settings import Settings

log = loom_logging.get("loom.supervisor")

LOCK_FILE = "serve.lock"
API_DRAIN_S = 5  # uvicorn's bound on answering in-flight requests once told to stop
# The worker's own bound on running jobs (workers.main.STOP_WAIT_S) and its shutdown.
WORKER_STOP_TIMEOUT_S = 8.0
BACKEND_STOP_TIMEOUT_S = 10.0
INDEX_STOP_TIMEOUT_S = 3.0
INDEX_SOCKET = "read-index.sock"
POLL_S = 0.1


class HomeInUse(RuntimeError):
    """Another `loom serve` runs on this home."""


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    stable_after_s: float = 10.0  # up this long, a child's next restart is quick again
    max_failures: int = 5  # failures within window_s after which the child is given up on
    window_s: float = 60.0


@dataclass
class Child:
    name: str
    spawn: Callable[[], subprocess.Popen[bytes]]
    stop_timeout_s: float
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    delay_s: float = 0.0
    failures: deque[float] = field(default_factory=deque)
    last_failure: str = ""
    # What a child started with start_gate.FLAG waits for on its stdin (None: not yet known).
    start_line: bytes | None = None

    def start(self) -> None:
        self.proc = self.spawn()
        self.started_at = time.monotonic()
        self.restart_at = None
        if self.start_line is not None:
            self._send_start_line()

    def release(self, line: bytes) -> None:
        """Let a child waiting at its start gate go on (and every restart of it at once)."""
        self.start_line = line
        if self.proc is not None:
            self._send_start_line()

    def _send_start_line(self) -> None:
        assert self.proc is not None and self.start_line is not None
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        # A child that already died gets its restart from supervise().
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(self.start_line)
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def adopt(self, proc: subprocess.Popen[bytes]) -> None:
        """Supervise a process started elsewhere (a backend's first start waits for it)."""
        self.proc = proc
        self.started_at = time.monotonic()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class Supervisor:
    def __init__(self, settings: Settings, policy: RestartPolicy | None = None):
        self.settings = settings
        self.policy = policy or RestartPolicy()
        self.backends: list[Child] = []
        self.workers: list[Child] = []
        self.api: list[Child] = []
        self.index: list[Child] = []
        self.stop_requested = False
        self.gave_up: Child | None = None
        self._lock_fd: int | None = None
        loom_logging.configure(settings.log_level, verbose=settings.log_verbose)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health probe

    @property
    def children(self) -> list[Child]:
        return [*self.backends, *self.workers, *self.index, *self.api]

    # ---- start -------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.stop_requested = True

    def take_home(self, say: Callable[[str], None]) -> None:
        """Hold HOME/serve.lock (until this process exits, even on SIGKILL), then stop
        orphaned backends on the home. Raises HomeInUse, or BackendInUse if a live Loom
        command uses the home's backends."""
        home = Path(self.settings.home)
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise HomeInUse(f"another `loom serve` (pid {owner}) runs on {home}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

        def note(message: str) -> None:
            log.warning("orphan_stopped", detail=message)
            say(message)

        clear_orphans(self.settings, note)

    def start_backends(self) -> tuple[str, str]:
        """Start the embedded backends (waiting until each answers); their URLs."""
        ch_url, redis_url = self.settings.clickhouse_url, self.settings.redis_url
        if self.settings.clickhouse_embedded:
            data_dir = clickhouse_dir(self.settings)
            cache_mb = self.settings.clickhouse_cache_mb
            endpoint = clickhouse_endpoint.start_endpoint(data_dir, die_with_parent=True, cache_mb=cache_mb)
            port = endpoint.port
            child = Child(
                "clickhouse",
                lambda: clickhouse_endpoint.spawn_endpoint(
                    data_dir, port, die_with_parent=True, cache_mb=cache_mb
                ),
                BACKEND_STOP_TIMEOUT_S,
            )
            child.adopt(endpoint.process)
            self.backends.append(child)
            ch_url = endpoint.url
        if self.settings.redis_embedded:
            rdir = redis_dir(self.settings)
            server = redis_server.start_redis(rdir, die_with_parent=True)
            child = Child(
                "redis", lambda: redis_server.spawn_redis(rdir, die_with_parent=True), BACKEND_STOP_TIMEOUT_S
            )
            child.adopt(server.process)
            self.backends.append(child)
            redis_url = server.url
        return ch_url, redis_url

    def start_services(self, workers: int) -> None:
        """Start the workers and the API before the backends: each imports its modules,
        then waits at its start gate (loom.start_gate) for release_services."""
        env = {**os.environ, "LOOM_HOME": str(self.settings.home)}
        if self.settings.log_verbose:  # `loom serve --verbose`
            env["LOOM_LOG_VERBOSE"] = "true"
        if self.settings.read_index_mb > 0:
            socket_path = str(self.settings.home / INDEX_SOCKET)
            env["LOOM_READ_INDEX_SOCKET"] = socket_path  # where the API finds it
            index_cmd = [
                sys.executable,
                "-m",
                "loom.read_index.process",
                "--socket",
                socket_path,
                start_gate.FLAG,
            ]
            self.index.append(Child("read-index", self._spawner(index_cmd, env), INDEX_STOP_TIMEOUT_S))
        # workers.process: `loom worker` without the command line's own modules.
        worker_cmd = [sys.executable, "-m", "workers.process", start_gate.FLAG]
        for i in range(workers):
            name = "worker" if workers == 1 else f"worker-{i + 1}"
            self.workers.append(Child(name, self._spawner(worker_cmd, env), WORKER_STOP_TIMEOUT_S))
        # uvicorn (loom.api.process) picks httptools and uvloop (uvicorn[standard]) on its
        # own: about a tenth of a millisecond less per request than h11 and asyncio's loop.
        api_cmd = [
            sys.executable,
            "-m",
            "loom.api.process",
            "--host",
            self.settings.host,
            "--port",
            str(self.settings.port),
            "--drain-seconds",
            str(API_DRAIN_S),
            start_gate.FLAG,
        ]
        self.api.append(Child("api", self._spawner(api_cmd, env), API_DRAIN_S + 3.0))
        for child in [*self.workers, *self.index, *self.api]:
            child.start()

    def release_services(self, clickhouse_url: str, redis_url: str) -> None:
        """The backends answer and the schema is current: the workers and the API go on
        (not waiting for them: see wait_healthy)."""
        line = start_gate.release_line({"LOOM_CLICKHOUSE_URL": clickhouse_url, "LOOM_REDIS_URL": redis_url})
        for child in [*self.workers, *self.index, *self.api]:
            child.release(line)

    @staticmethod
    def _spawner(cmd: list[str], env: dict[str, str]) -> Callable[[], subprocess.Popen[bytes]]:
        def spawn() -> subprocess.Popen[bytes]:
            # A session of its own: a terminal's Ctrl-C (sent to the foreground process
            # group) reaches the supervisor only, which then stops the children in order.
            return subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

        return spawn

    def wait_healthy(self, url: str, timeout: float = 120.0) -> str | None:
        """Wait until `url` answers 200; None then, else why not (a child that died
        while starting is named: at start-up nothing is restarted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stop_requested:
                return "stopped while starting"
            for child in self.children:
                if child.proc is not None and (code := child.proc.poll()) is not None:
                    return f"the {child.name} exited with {_exit_text(code)} while starting"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return None
            time.sleep(POLL_S)
        return f"{url} did not answer 200 within {timeout:.0f}s"

    # ---- run ---------------------------------------------------------------------

    def supervise(self) -> None:
        """Keep every child running until a stop is requested or one is given up on."""
        while not self.stop_requested and self.gave_up is None:
            now = time.monotonic()
            for child in self.children:
                self._tend(child, now)
            time.sleep(POLL_S)

    def _tend(self, child: Child, now: float) -> None:
        if child.proc is not None:
            code = child.proc.poll()
            if code is None:
                if child.delay_s and now - child.started_at >= self.policy.stable_after_s:
                    child.delay_s = 0.0
                return
            child.proc = None
            self._failed(child, now, f"exited with {_exit_text(code)}")
        if child.restart_at is not None and now >= child.restart_at and self.gave_up is None:
            try:
                child.start()
            except OSError as exc:
                self._failed(child, now, f"could not be started: {exc}")
                return
            log.warning("child_restarted", child=child.name, pid=child.proc.pid if child.proc else None)

    def _failed(self, child: Child, now: float, why: str) -> None:
        child.last_failure = why
        child.failures.append(now)
        while now - child.failures[0] > self.policy.window_s:
            child.failures.popleft()
        if len(child.failures) >= self.policy.max_failures:
            log.error(
                "child_given_up",
                child=child.name,
                why=why,
                failures=len(child.failures),
                window_s=self.policy.window_s,
            )
            self.gave_up = child
            return
        p = self.policy
        child.delay_s = min(child.delay_s * 2, p.max_delay_s) if child.delay_s else p.first_delay_s
        child.restart_at = now + child.delay_s
        log.warning(
            "child_died",
            child=child.name,
            why=why,
            restart_in_s=round(child.delay_s, 2),
            failures_in_window=len(child.failures),
        )

    def give_up_message(self) -> str:
        child = self.gave_up
        if child is None:
            return ""
        return (
            f"the {child.name} failed {len(child.failures)} times within {self.policy.window_s:.0f}s "
            f"(last: {child.last_failure}); gave up"
        )

    # ---- stop --------------------------------------------------------------------

    def stop(self) -> None:
        """The API, then the workers, then the backends: each group is told to stop
        together and waited for (killed past its bound)."""
        for group in (self.api, self.workers + self.index, self.backends):
            started = time.monotonic()
            self._stop_group(group)
            if group:
                log.info(
                    "stopped", children=[c.name for c in group], seconds=round(time.monotonic() - started, 2)
                )
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @staticmethod
    def _stop_group(group: list[Child]) -> None:
        running = [c for c in group if c.proc is not None and c.proc.poll() is None]
        for child in group:
            child.restart_at = None
        for child in running:
            assert child.proc is not None
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        for child in running:
            assert child.proc is not None
            try:
                child.proc.wait(max(0.0, started + child.stop_timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("child_killed", child=child.name, after_s=child.stop_timeout_s)
                child.proc.kill()
                child.proc.wait()
