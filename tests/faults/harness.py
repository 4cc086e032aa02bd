"""A real `loom serve` under client load, for the fault suite: start it, find its
children, kill them, and record what every request got back."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

LOOM = [sys.executable, "-m", "loom.cli.main"]
CHILDREN = ("worker", "api", "clickhouse", "redis", "read-index")
REQUEST_TIMEOUT_S = 30.0  # a request not answered in this long counts as a hang
EMBED_WAIT_S = 8  # the appends' bounded wait for their embedding (LOOM_EMBED_WAIT_SECONDS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_home() -> Path:
    # Short: the redis unix socket path must stay under ~100 characters.
    return Path(tempfile.mkdtemp(prefix="loomf-", dir="/tmp"))


def child_kind(proc: psutil.Process) -> str | None:
    try:
        args = proc.cmdline()
        name = proc.name()
    except psutil.Error:
        return None
    if "redis-server" in name:
        return "redis"
    if "loom.embedded.clickhouse_endpoint" in args:
        return "clickhouse"
    if "loom.api.process" in args:
        return "api"
    if "loom.read_index.process" in args:
        return "read-index"
    if "workers.process" in args or ("loom.cli.main" in args and "worker" in args):
        return "worker"
    return None


class Serve:
    """One `loom serve` process on `home` (its output in home/serve-N.out)."""

    _runs = itertools.count(1)

    def __init__(self, home: Path, port: int, **env: str):
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        self.env.update(
            LOOM_HOME=str(home),
            LOOM_EMBEDDER="fake",
            LOOM_PORT=str(port),
            LOOM_EMBED_WAIT_SECONDS=str(EMBED_WAIT_S),
            # The recovery pass at its shortest: a turn a crash left unembedded gets
            # its row within ~20 s of its insert (the grace, then the next pass).
            LOOM_EMBED_RECOVERY_GRACE_SECONDS=str(EMBED_WAIT_S + 5),
            LOOM_EMBED_RECOVERY_INTERVAL_SECONDS="5",
            **env,
        )
        self.out_path = home / f"serve-{next(self._runs)}.out"
        with open(self.out_path, "wb") as out:
            # A group of its own: the tests signal it (and kill -9 it) as a terminal would.
            self.proc = subprocess.Popen(
                [*LOOM, "serve"], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 150.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"loom serve exited with {self.proc.returncode}:\n{self.output()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"loom serve did not become healthy:\n{self.output()[-3000:]}")

    def children(self) -> dict[str, psutil.Process]:
        found: dict[str, psutil.Process] = {}
        with_kind = ((child_kind(p), p) for p in psutil.Process(self.proc.pid).children())
        for kind, proc in with_kind:
            if kind is not None:
                found[kind] = proc
        return found

    def all_descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def loom(self, *args: str) -> str:
        out = subprocess.run([*LOOM, *args], env=self.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def signal_and_wait(self, sig: int, timeout: float = 30.0) -> tuple[int, float]:
        """Send `sig` to the serve process only; its exit code and how long it took."""
        started = time.monotonic()
        os.kill(self.proc.pid, sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(
                f"loom serve did not stop within {timeout}s:\n{self.output()[-3000:]}"
            ) from None
        return code, time.monotonic() - started

    def kill_group(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        """Stop it if it still runs (the tests' own stops come first)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_group()

    def clickhouse(self) -> Any:
        from loom.store.clickhouse import connect

        port = int((self.home / "clickhouse" / "endpoint.port").read_text().strip())
        return connect(f"http://127.0.0.1:{port}", database="loom")


@dataclass
class Outcome:
    op: str
    started: float
    ended: float
    status: int | None  # None: no HTTP answer (see error)
    error: str = ""
    retry_after: str | None = None
    body: Any = None


@dataclass
class Acked:
    thread_id: str
    msg_id: str
    role: str
    embedding: str  # what the append's answer said about the turn's embedding


@dataclass
class Load:
    """Appenders (single-turn and batch, each retrying a turn with its msg_id until it
    is answered 200) and a searcher, on one namespace, until stopped."""

    base: str
    token: str
    namespace: str
    appenders: int = 2
    batch_appenders: int = 1
    searchers: int = 1
    outcomes: list[Outcome] = field(default_factory=list)
    acked: dict[tuple[str, str], Acked] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        targets = [(self._append_loop, f"s{i}", False) for i in range(self.appenders)]
        targets += [(self._append_loop, f"b{i}", True) for i in range(self.batch_appenders)]
        targets += [(self._search_loop, f"q{i}", False) for i in range(self.searchers)]
        for target, name, batch in targets:
            thread = threading.Thread(target=target, args=(name, batch), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"

    def _post(self, client: httpx.Client, op: str, body: dict[str, Any]) -> Outcome:
        started = time.monotonic()
        try:
            r = client.post(
                f"{self.base}/v1/{op}", json=body, headers={"Authorization": f"Bearer {self.token}"}
            )
        except httpx.HTTPError as exc:
            outcome = Outcome(op, started, time.monotonic(), None, f"{type(exc).__name__}: {exc}"[:300])
        else:
            try:
                parsed = r.json()
            except ValueError:
                parsed = r.text[:300]
            outcome = Outcome(
                op, started, time.monotonic(), r.status_code, "", r.headers.get("retry-after"), parsed
            )
        with self._lock:
            self.outcomes.append(outcome)
        return outcome

    def _append_loop(self, thread_id: str, batch: bool) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            for seq in itertools.count():
                if self._stop.is_set():
                    return
                turns = (
                    [self._turn(thread_id, 2 * seq), self._turn(thread_id, 2 * seq + 1)]
                    if batch
                    else [self._turn(thread_id, seq)]
                )
                # Retry the same turns (same msg_ids) until they are answered 200.
                while not self._stop.is_set():
                    body: dict[str, Any] = {"namespace": self.namespace}
                    body.update({"turns": turns} if batch else turns[0])
                    outcome = self._post(client, "conversation.append", body)
                    if outcome.status == 200:
                        results = outcome.body["results"] if batch else [outcome.body]
                        self._note_acked(results)
                        break
                    time.sleep(0.1)

    def _note_acked(self, results: list[dict[str, Any]]) -> None:
        with self._lock:
            for r in results:
                if r["stored"] or r.get("reason") == "duplicate":
                    key = (r["thread_id"], r["msg_id"])
                    self.acked.setdefault(key, Acked(r["thread_id"], r["msg_id"], r["role"], r["embedding"]))

    @staticmethod
    def _turn(thread_id: str, seq: int) -> dict[str, Any]:
        role = "user" if seq % 2 == 0 else "assistant"
        return {
            "thread_id": thread_id,
            "msg_id": f"{thread_id}-{seq:05d}",
            "role": role,
            "content": f"{role} turn {seq} of {thread_id}: the invoices moved to the new ledger in week {seq}",
        }

    def _search_loop(self, _name: str, _batch: bool) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                self._post(
                    client,
                    "conversation.search",
                    {
                        "namespace_scope": "one",
                        "namespace": self.namespace,
                        "query": "which ledger holds the invoices",
                        "limit": 5,
                    },
                )
                time.sleep(0.05)

    def probe_append(self, client: httpx.Client, n: int) -> Outcome:
        """One more turn on a thread of its own, and its own answer (other threads' land
        in `outcomes` meanwhile)."""
        turn = self._turn("probe", n)
        outcome = self._post(client, "conversation.append", {"namespace": self.namespace, **turn})
        if outcome.status == 200:
            self._note_acked([outcome.body])
        return outcome


def listed_msg_ids(base: str, token: str, namespace: str, thread_id: str) -> list[str]:
    """Every msg_id conversation.list returns for the thread, page by page."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        body: dict[str, Any] = {"namespace": namespace, "thread_id": thread_id, "limit": 500}
        if cursor:
            body["cursor"] = cursor
        r = httpx.post(
            f"{base}/v1/conversation.list",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        page = r.json()
        ids += [m["msg_id"] for m in page["messages"]]
        cursor = page.get("next_cursor")
        if not cursor:
            return ids
