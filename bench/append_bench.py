"""conversation.append on the whole embedded stack: throughput and latency.

Run: ``.venv/bin/python bench/append_bench.py [--quick] [--clients 32] [--seconds 20]``

It starts everything itself, as ``loom serve`` does, in a temporary LOOM_HOME: the
embedded ClickHouse endpoint, the embedded Redis, one arq worker process (the real
MiniLM embedder unless ``--embedder fake``) and the API under uvicorn. Then, from
`--clients` concurrent clients (closed loop, keep-alive connections), it measures:

1. appends that need no embedding (tool/system turns): turns/s, median and p99;
2. single-turn user/assistant appends (~200-character texts): turns/s, median and p99;
3. batch ingest (`turns: [...]`) of `--ingest-turns` user/assistant turns: turns/s;

and the raw model's rate on the same texts as each of phases 2 and 3 (a sample of the
very texts the phase sends), measured in this run before and after, with the stack
down: MiniLM alone, as bench/model_rate.py runs it (2 threads, batches of 32). Phases
2 and 3 are shown as a share of it. The texts carry a unique number prefix (so no two
are the same turn); it adds ~10 tokens to ~36, which is why the raw model is never
measured on other texts. For reference it also prints the rate of the worker's own
model configuration (its ModelBatcher: single-threaded calls of up to 8 texts, one per
core) on the same texts.
Targets: (1) >= 1,500 turns/s with p99 <= 50 ms; (2) >= 85 % of the raw model with
p99 <= 300 ms; (3) >= 90 % of the raw model.

The load generator speaks HTTP/1.1 over raw asyncio streams: on this 2-core machine a
full HTTP client library would take a large share of the CPU the server needs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.model_rate import make_text  # noqa: E402

NAMESPACE = "bench"
INGEST_BASE = 10**8  # ingest turn numbers start here (single-turn ones at 0)


class Texts:
    """The turns' texts: ~200 characters, unique per number and per run."""

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.pool = [make_text(rng, rng.randint(180, 220)) for _ in range(4096)]
        self.run_id = f"{time.time_ns()}"

    def __call__(self, k: int) -> str:
        return f"{k} {self.run_id} " + self.pool[k % len(self.pool)][: 200 - 20]

    def sample(self, base: int, n: int = 512) -> list[str]:
        return [self(base + k) for k in range(n)]


# -- a lean HTTP/1.1 client ------------------------------------------------------------


class Conn:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = (
            f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            sock = self.writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert self.reader is not None
        data = json.dumps(body).encode()
        self.writer.write(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\n"
            + self.head
            + b"Content-Length: "
            + str(len(data)).encode()
            + b"\r\n\r\n"
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = await self.reader.readexactly(length)
        return status, json.loads(payload)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# -- the stack --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    home: Path
    port: int
    embedder: str
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path = Path("/dev/null")

    def start(self, log: Callable[[str], None]) -> None:
        self.env = {
            **os.environ,
            "LOOM_HOME": str(self.home),
            "LOOM_PORT": str(self.port),
            "LOOM_EMBEDDER": self.embedder,
            "LOOM_LOG_LEVEL": "WARNING",
        }
        for var in ("LOOM_CLICKHOUSE_URL", "LOOM_REDIS_URL"):
            self.env.pop(var, None)  # embedded mode
        t0 = time.monotonic()
        self.log_path = self.home / "serve.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loom.cli.main", "serve", "--workers", "1"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("wb"),
        )
        import httpx

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("loom serve exited: " + self.log_path.read_text()[-3000:])
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the API did not come up")
        log(
            f"stack up in {time.monotonic() - t0:.1f}s (LOOM_HOME={self.home}, port {self.port}, "
            f"embedder {self.embedder})"
        )

    def mint(self) -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "loom.cli.main",
                "token",
                "mint",
                "--namespace",
                NAMESPACE,
                "--role",
                "admin",
            ],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        return out.stdout.decode().strip().splitlines()[-1]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- measurements -----------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    """The API's Prometheus figures (counters and histogram sums/counts)."""
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith("loom_append_flush") and not line.startswith("#") and "_bucket" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def flush_summary(before: dict[str, float], after: dict[str, float]) -> str:
    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    n = d("loom_append_flush_rows_count")
    if not n:
        return "no flushes"
    parts = [f"{n:.0f} flushes, {d('loom_append_flush_rows_sum') / n:.1f} turns/flush"]
    for stage in ("state", "claim", "insert", "total"):
        key = f'loom_append_flush_seconds_{{}}{{{{stage="{stage}"}}}}'
        cnt = d(key.format("count"))
        if cnt:
            parts.append(f"{stage} {d(key.format('sum')) / cnt * 1000:.1f} ms")
    return ", ".join(parts)


@dataclass
class Phase:
    name: str
    turns: int
    seconds: float
    latencies: list[float]
    errors: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    @property
    def median(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")


async def closed_loop(
    name: str,
    conns: list[Conn],
    make_body: Callable[[int, int], dict[str, Any]],
    seconds: float,
    warmup: float,
    turns_per_call: int = 1,
) -> Phase:
    """Every client sends, waits for the answer, sends again; only calls started after
    the warm-up and finished before the end count."""
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup
    end = start + seconds
    lat: list[float] = []
    outcomes: dict[str, int] = {}
    errors = 0
    done_turns = 0

    async def client(c: int, conn: Conn) -> None:
        nonlocal errors, done_turns
        i = 0
        while loop.time() < end:
            t0 = loop.time()
            status, body = await conn.post("/v1/conversation.append", make_body(c, i))
            t1 = loop.time()
            i += 1
            if status != 200:
                errors += 1
                continue
            results = body.get("results", [body])
            if t0 >= start and t1 <= end:
                lat.append(t1 - t0)
                done_turns += len(results)
                for r in results:
                    key = r["embedding"] if r["stored"] else f"not stored: {r['reason']}"
                    outcomes[key] = outcomes.get(key, 0) + 1

    await asyncio.gather(*(client(c, conn) for c, conn in enumerate(conns)))
    return Phase(name, done_turns, seconds, lat, errors, outcomes)


async def ingest(conns: list[Conn], total: int, batch: int, texts: Callable[[int], str]) -> Phase:
    """Send `total` user/assistant turns in batches of `batch` from every client at once."""
    loop = asyncio.get_running_loop()
    next_start = 0
    lat: list[float] = []
    outcomes: dict[str, int] = {}
    errors = 0

    async def client(conn: Conn) -> None:
        nonlocal next_start, errors
        while next_start < total:
            lo = next_start
            hi = min(total, lo + batch)
            next_start = hi
            turns = [
                {
                    "thread_id": f"ingest-{k // 50}",
                    "role": "user" if k % 2 == 0 else "assistant",
                    "content": texts(k),
                }
                for k in range(lo, hi)
            ]
            t0 = loop.time()
            status, body = await conn.post(
                "/v1/conversation.append", {"namespace": NAMESPACE, "turns": turns}
            )
            lat.append(loop.time() - t0)
            if status != 200:
                errors += 1
                continue
            for r in body["results"]:
                key = r["embedding"] if r["stored"] else f"not stored: {r['reason']}"
                outcomes[key] = outcomes.get(key, 0) + 1

    t0 = loop.time()
    await asyncio.gather(*(client(conn) for conn in conns))
    return Phase(f"batch ingest ({batch}/request)", total, loop.time() - t0, lat, errors, outcomes)


def raw_model_rate(texts: list[str], seconds: float, batch: int = 32) -> float:
    """The embedder alone on the same texts: MiniLM, 2 threads, batches of 32 (bench/model_rate.py)."""
    from bench.model_rate import throughput
    from loom.providers.embedders.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder(intra_op_num_threads=2, batch_size=batch)
    emb.embed(texts[:batch])
    return throughput(emb, texts, batch, seconds)


def worker_config_rate(texts: list[str], seconds: float) -> float:
    """The model as a worker runs it: the worker's own ModelBatcher and embedder (built
    from settings), kept busy by two concurrent 32-text callers."""
    from loom.settings import Settings
    from workers.embed_jobs import ModelBatcher, embedder_from_settings, model_parallelism, set_embedder

    async def measure() -> float:
        batcher = ModelBatcher(parallel=model_parallelism())
        loop = asyncio.get_running_loop()
        done = 0

        async def caller(k: int) -> None:
            nonlocal done
            i = k * 32
            while loop.time() < stop:
                await batcher([texts[(i + j) % len(texts)] for j in range(32)])
                done += 32
                i += 64

        await batcher(texts[:32])  # warm
        t0 = loop.time()
        stop = t0 + seconds
        await asyncio.gather(caller(0), caller(1))
        elapsed = loop.time() - t0
        await batcher.close()
        return done / elapsed

    previous = set_embedder(embedder_from_settings(Settings(embedder="minilm")))
    try:
        return asyncio.run(measure())
    finally:
        set_embedder(previous)


def wait_idle(log: Callable[[str], None], busy_below: float = 0.15, timeout: float = 60.0) -> None:
    """Wait until the machine's CPUs are idle (busy share over one second below
    `busy_below`): a raw rate measured while the stopped stack's processes still wind
    down would read low and flatter the shares."""
    from bench.harness import cpu_idle

    deadline = time.monotonic() + timeout
    while True:
        idle = cpu_idle()
        if idle is None or 1 - idle < busy_below:
            return
        if time.monotonic() > deadline:
            log(f"(the machine stayed {1 - idle:.0%} busy; measuring anyway)")
            return


@dataclass
class RawRates:
    """The raw model on each embedded phase's own texts, measured before and after the stack."""

    samples: dict[str, list[str]]
    seconds: float
    rates: dict[str, list[float]] = field(default_factory=dict)
    worker: dict[str, float] = field(default_factory=dict)

    def measure(self, when: str, log: Callable[[str], None]) -> None:
        for phase, texts in self.samples.items():
            wait_idle(log)
            rate = raw_model_rate(texts, self.seconds)
            self.rates.setdefault(phase, []).append(rate)
            log(
                f"raw model on the {phase} texts ({when}; MiniLM int8, 2 threads, batch 32, stack down): "
                f"{rate:.1f} texts/s"
            )

    def measure_worker(self, log: Callable[[str], None]) -> None:
        for phase, texts in self.samples.items():
            self.worker[phase] = worker_config_rate(texts, self.seconds)
            log(
                f"  for reference, the worker's own model configuration (its ModelBatcher) on the {phase} "
                f"texts: {self.worker[phase]:.1f} texts/s"
            )

    def mean(self, phase: str) -> float | None:
        rates = self.rates.get(phase)
        return statistics.mean(rates) if rates else None


# -- main -------------------------------------------------------------------------------


def show(p: Phase, raw: float | None, target: str) -> str:
    share = f" = {p.rate / raw * 100:5.1f}% of raw" if raw else ""
    return (
        f"{p.name:<38} {p.rate:8.1f} turns/s{share}   median {p.median:7.1f} ms   p99 {p.pct(0.99):7.1f} ms"
        f"   [{target}]   errors {p.errors}   {dict(sorted(p.outcomes.items()))}"
    )


Row = tuple[Phase, str, str, str]  # phase, the raw-model texts it compares with ("" none), target, flushes


async def run(
    args: argparse.Namespace, stack: Stack, texts: Texts, raws: RawRates, log: Callable[[str], None]
) -> list[Row]:
    token = stack.mint()
    admin = Conn("127.0.0.1", stack.port, token)
    status, body = await admin.post("/v1/conversation.set_logging", {"namespace": NAMESPACE, "enabled": True})
    assert status == 200, body
    pool, run_id = texts.pool, texts.run_id
    conns = [Conn("127.0.0.1", stack.port, token) for _ in range(args.clients)]
    # Warm every path (model load, first parts, connections).
    status, body = await conns[0].post(
        "/v1/conversation.append",
        {"namespace": NAMESPACE, "thread_id": "warm", "role": "user", "content": "warm up " + run_id},
    )
    assert status == 200 and body["stored"], body
    rows: list[Row] = []

    before = scrape(stack.port)
    if "tool" in args.phases:
        phase = await closed_loop(
            "appends, no embedding (tool/system)",
            conns,
            lambda c, i: {
                "namespace": NAMESPACE,
                "thread_id": f"tool-{c}",
                "role": "tool" if i % 2 else "system",
                "content": f"{c}-{i}-{run_id} tool output " + pool[i % len(pool)][:120],
            },
            args.seconds,
            args.warmup,
        )
        rows.append(
            (
                phase,
                "",
                "target >= 1,500/s, p99 <= 50 ms",
                flush_summary(before, before := scrape(stack.port)),
            )
        )
        log(show(phase, None, rows[-1][2]) + "\n    " + rows[-1][3])

    if "single" in args.phases:
        counter = iter(range(10**9))
        phase = await closed_loop(
            "single-turn user/assistant appends",
            conns,
            lambda c, i: {
                "namespace": NAMESPACE,
                "thread_id": f"chat-{c}",
                "role": "user" if i % 2 else "assistant",
                "content": texts(next(counter)),
            },
            args.seconds,
            args.warmup,
        )
        rows.append(
            (
                phase,
                "single",
                "target >= 85% of raw, p99 <= 300 ms",
                flush_summary(before, before := scrape(stack.port)),
            )
        )
        log(show(phase, raws.mean("single"), rows[-1][2]) + "\n    " + rows[-1][3])

    if "ingest" in args.phases and args.ingest_turns:
        phase = await ingest(
            conns[: args.ingest_clients],
            args.ingest_turns,
            args.ingest_batch,
            lambda k: texts(INGEST_BASE + k),
        )
        rows.append((phase, "ingest", "target >= 90% of raw", flush_summary(before, scrape(stack.port))))
        log(show(phase, raws.mean("ingest"), rows[-1][2]) + "\n    " + rows[-1][3])
    for c in conns + [admin]:
        await c.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="short phases and a 10,000-turn ingest")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per closed-loop phase")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--ingest-turns", type=int, default=100_000)
    ap.add_argument("--ingest-batch", type=int, default=100, help="turns per batch request")
    ap.add_argument("--ingest-clients", type=int, default=8, help="concurrent batch requests")
    ap.add_argument("--embedder", choices=("minilm", "fake"), default="minilm")
    ap.add_argument("--raw-seconds", type=float, default=8.0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary LOOM_HOME")
    ap.add_argument("--phases", default="tool,single,ingest", help="comma-separated: tool, single, ingest")
    args = ap.parse_args()
    args.phases = set(args.phases.split(","))
    if args.quick:
        args.seconds, args.warmup, args.raw_seconds = 8.0, 2.0, 5.0
        args.ingest_turns = min(args.ingest_turns, 10_000)

    def log(msg: str) -> None:
        print(msg, flush=True)

    texts = Texts()
    samples = {"single": texts.sample(0), "ingest": texts.sample(INGEST_BASE)}
    raws = RawRates({k: v for k, v in samples.items() if k in args.phases}, args.raw_seconds)
    minilm = args.embedder == "minilm"
    if minilm:
        raws.measure("before", log)
    load_before = os.getloadavg()

    home = Path(tempfile.mkdtemp(prefix="loomb-", dir="/tmp"))
    stack = Stack(home, free_port(), args.embedder)
    try:
        stack.start(log)
        rows = asyncio.run(run(args, stack, texts, raws, log))
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    load_after = os.getloadavg()
    if minilm:
        raws.measure("after", log)
        raws.measure_worker(log)
    print(f"\n== conversation.append, embedded stack, {args.clients} clients, {os.cpu_count()} CPUs ==")
    print(
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}: other work on the machine "
        "skews every figure; the shares below use the mean raw rate of this run on the phase's own texts"
    )
    for key, rates in raws.rates.items():
        worker = raws.worker.get(key)
        print(
            f"raw model on the {key} texts: {' / '.join(f'{r:.1f}' for r in rates)} texts/s (before / after), "
            f"mean {statistics.mean(rates):.1f}"
            + (f"; worker's configuration {worker:.1f}" if worker else "")
        )
    for phase, key, target, flushes in rows:
        print(show(phase, raws.mean(key) if key else None, target))
        print("    " + flushes)


if __name__ == "__main__":
    main()
