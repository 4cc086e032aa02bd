"""Question: Does any process of `loom serve` grow in memory under a steady mixed load for 30-120
minutes?

    python -m bench.studies.soak --minutes 30 [--preload-turns 12000]

Result: bench/results/<date>-soak-<minutes>m.{json,txt} (last:
2026-12-03-1205-soak-60m-preload12k-release).

A soak: Loom as a user starts it, under half its peak load for N minutes, RSS per process.

1. Starts ``loom serve`` on its embedded defaults (the embedded ClickHouse endpoint, the
   embedded redis-server, one arq worker with the real MiniLM embedder, the API) in a
   temporary LOOM_HOME (bench/loom_stack.py), mints an admin token, turns recording on.
2. Measures the peak: `--probe-clients` closed-loop clients for `--probe-seconds` of the
   mix below; the ops answered per second is the peak (skipped with `--rate`).
3. Drives half of it (open loop: requests leave at a steady rate whether or not earlier
   ones were answered, at most `--max-inflight` in flight; a request that finds them all
   busy is counted as shed) for `--minutes`: 60 % single-turn user/assistant appends,
   25 % conversation.search, 10 % conversation.save_message of a turn appended earlier,
   5 % session.brief_save of agent-written sections (no LLM).
4. Every `--sample-seconds` it reads VmRSS (and its parts: RssAnon, the heap; RssFile,
   pages of mapped files such as the chdb library's code, bounded by their size) from
   /proc of EVERY process of the serve group (``loom serve`` itself, the API, the
   worker, the ClickHouse endpoint, redis-server, anything else they started), named by
   role; and the embedded engine's own account of its memory (system.metrics:
   MemoryTracking and the caches' bytes; system.jemalloc_stats: allocated, resident,
   retained).

Per process it reports RSS after the warm-up (`--warmup-seconds`, default the first
third of the run but at least 60 s: the last 20 minutes of a 30-minute run), at the end,
the max, and the slope (least squares over the post-warm-up samples, MB per 10 minutes),
of RSS and of its anonymous and file-backed parts. A process is flat when the slope of
its RSS is under `--flat-mb` MB per 10 minutes (default 2). A process restarted during
the run (its pid changed) is flagged: its series is not comparable. Also: requests, errors by op and
status, shed requests, and latency medians and p99 per op. Results: the table on stdout
and ``<out>/<date>-soak-<minutes>m.{json,txt}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.httpclient import HttpError, LeanClient
from bench.loom_stack import REPO, LoomStack, descendants
from bench.report import save_run

NAMESPACE = "soak"
USERS = ["u1", "u2", "u3", "u4"]
THREADS = 200
WORDS = [
    "river",
    "cache",
    "table",
    "vector",
    "lease",
    "thread",
    "model",
    "query",
    "brief",
    "merge",
    "index",
    "parser",
    "budget",
    "tenant",
    "latency",
    "replica",
    "window",
    "summary",
    "token",
    "shard",
    "cluster",
    "commit",
    "rollback",
    "schema",
    "payload",
    "worker",
    "garden",
    "harbor",
    "violin",
    "planet",
    "kettle",
    "ladder",
    "marble",
    "orchard",
    "pencil",
    "saddle",
    "tunnel",
    "velvet",
    "whistle",
]

# op name -> share of the mix
MIX = {"append": 0.60, "search": 0.25, "save": 0.10, "brief": 0.05}


# -- processes -----------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def role_of(pid: int, supervisor: int) -> str:
    if pid == supervisor:
        return "supervisor"
    cmd = _cmdline(pid)
    if "loom.api.process" in cmd:
        return "api"
    if "workers.process" in cmd or "loom.cli.main worker" in cmd:
        return "worker"
    if "redis-server" in cmd:
        return "redis-server"
    if "clickhouse_endpoint" in cmd:
        return "clickhouse-endpoint"
    return cmd.split(" ")[0].rsplit("/", 1)[-1] or f"pid-{pid}"


def rss_mb(pid: int) -> tuple[float, float, float] | None:
    """(VmRSS, RssAnon, RssFile) in MB."""
    fields: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssFile"):
                    fields[name] = int(rest.split()[0]) / 1024.0
    except OSError:
        return None
    if "VmRSS" not in fields:
        return None
    return fields["VmRSS"], fields.get("RssAnon", 0.0), fields.get("RssFile", 0.0)


ENGINE_METRICS = (
    "SELECT metric, value FROM system.metrics WHERE metric = 'MemoryTracking' "
    "OR (metric LIKE '%CacheBytes' AND value > 0) FORMAT TSV"
)


def engine_query(clickhouse_url: str, sql: str, *, timeout: float = 10) -> str:
    """One statement over the endpoint's HTTP interface (POST: SYSTEM statements too)."""
    import urllib.parse
    import urllib.request

    url = f"{clickhouse_url}/?{urllib.parse.urlencode({'query': sql})}"
    with urllib.request.urlopen(urllib.request.Request(url=url, data=b""), timeout=timeout) as r:
        return str(r.read().decode())


def engine_memory_mb(clickhouse_url: str) -> dict[str, float]:
    """The embedded engine's account of its memory, MB: tracked memory, each non-empty
    cache, and jemalloc's allocated / resident / retained (what RSS holds beyond them);
    and (`count_*`, plain counts) the queries running and the parts held."""
    import re

    out: dict[str, float] = {}
    for line in engine_query(clickhouse_url, ENGINE_METRICS).splitlines():
        name, value = line.split("\t")
        out[name] = int(value) / 1e6
    # Counts, not MB: queries running (each holds memory while it runs) and parts
    # (active, and merged away but not yet removed: each keeps its metadata in memory).
    counts = engine_query(
        clickhouse_url,
        "SELECT (SELECT value FROM system.metrics WHERE metric = 'Query'), "
        "countIf(_state = 'Active'), countIf(_state != 'Active') FROM system.parts FORMAT TSV",
    ).split()
    out["count_queries_running"], out["count_parts_active"], out["count_parts_inactive"] = map(float, counts)
    # What grows with the data rather than with time: the merges running (a vector
    # table's merge builds its part's HNSW index in memory), the primary keys loaded, the
    # rows held; and the engine's threads (each holds an allocator cache).
    held = engine_query(
        clickhouse_url,
        "SELECT (SELECT sum(memory_usage) FROM system.merges), "
        "(SELECT sum(primary_key_bytes_in_memory_allocated) FROM system.parts), "
        "(SELECT sum(rows) FROM system.parts WHERE active), "
        "(SELECT value FROM system.metrics WHERE metric = 'GlobalThread') FORMAT TSV",
    ).split()
    out["MergesMemory"], out["PrimaryKeyBytes"] = float(held[0]) / 1e6, float(held[1]) / 1e6
    out["count_rows_active"], out["count_threads"] = float(held[2]), float(held[3])
    stats = engine_query(clickhouse_url, "SELECT stats FROM system.jemalloc_stats FORMAT TSVRaw")
    m = re.search(
        r"Allocated: (\d+), active: (\d+), metadata: (\d+).*?resident: (\d+), mapped: (\d+), retained: (\d+)",
        stats,
    )
    if m:
        for key, value in zip(
            (
                "jemalloc_allocated",
                "jemalloc_active",
                "jemalloc_metadata",
                "jemalloc_resident",
                "jemalloc_mapped",
                "jemalloc_retained",
            ),
            m.groups(),
            strict=True,
        ):
            out[key] = int(value) / 1e6
    return out


# Everything the engine holds that it can rebuild from disk, then jemalloc's free pages.
RELEASE_STATEMENTS = (
    "SYSTEM DROP MARK CACHE",
    "SYSTEM DROP UNCOMPRESSED CACHE",
    "SYSTEM DROP INDEX MARK CACHE",
    "SYSTEM DROP INDEX UNCOMPRESSED CACHE",
    "SYSTEM DROP PRIMARY INDEX CACHE",
    "SYSTEM DROP QUERY CONDITION CACHE",
    "SYSTEM DROP QUERY CACHE",
    "SYSTEM DROP MMAP CACHE",
    "SYSTEM DROP COMPILED EXPRESSION CACHE",
    "SYSTEM DROP VECTOR SIMILARITY INDEX CACHE",
    "SYSTEM JEMALLOC PURGE",
)


async def release_probe(clickhouse_url: str, endpoint_pid: int | None, settle_s: float) -> dict[str, Any]:
    """What the engine's growth is made of, once the load has stopped: its RSS and own
    account `settle_s` after the last request (merges finish, outdated parts age), then
    again after every cache it can rebuild from disk is dropped and jemalloc purged.
    What the drop gives back was cache (bounded by the caches' sizes); what stays is held
    by the parts and by the engine itself (a leak would stay and grow with the ops)."""

    def snapshot() -> dict[str, float]:
        out = engine_memory_mb(clickhouse_url)
        got = rss_mb(endpoint_pid) if endpoint_pid else None
        if got:
            out["rss"], out["rss_anon"], _ = got
        return out

    await asyncio.sleep(settle_s)
    settled = await asyncio.to_thread(snapshot)
    for sql in RELEASE_STATEMENTS:
        await asyncio.to_thread(engine_query, clickhouse_url, sql, timeout=60)
    await asyncio.sleep(5)
    dropped = await asyncio.to_thread(snapshot)
    return {"settle_s": settle_s, "settled": settled, "caches_dropped": dropped}


def serve_group(supervisor: int) -> dict[str, int]:
    """role -> pid for the serve group (redis-server runs in a session of its own but is
    still a child of `loom serve`)."""
    out: dict[str, int] = {"supervisor": supervisor}
    for pid in descendants(supervisor):
        role = role_of(pid, supervisor)
        name, n = role, 1
        while name in out and out[name] != pid:
            n += 1
            name = f"{role}-{n}"
        out[name] = pid
    return out


@dataclass
class Series:
    pids: list[int] = field(default_factory=list)  # every pid seen (a restart adds one)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (t seconds, MB)
    anon: list[tuple[float, float]] = field(default_factory=list)  # RssAnon
    file: list[tuple[float, float]] = field(default_factory=list)  # RssFile


def slope_mb_per_10min(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return 0.0
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 600.0


# -- load ----------------------------------------------------------------------------


@dataclass
class Load:
    client: LeanClient
    rng: random.Random
    seq: int = 0
    appended: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=2_000))
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    embedding: Counter[str] = field(default_factory=Counter)
    done: int = 0
    mix: dict[str, float] = field(default_factory=lambda: dict(MIX))

    def text(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def pick(self) -> str:
        r, acc = self.rng.random(), 0.0
        for op, share in self.mix.items():
            acc += share
            if r < acc:
                return op
        return "append"

    def body(self, op: str) -> tuple[str, dict[str, Any]]:
        self.seq += 1
        i = self.seq
        if op == "save" and self.appended:
            thread, msg = self.appended[self.rng.randrange(len(self.appended))]
            return "/v1/conversation.save_message", {
                "namespace": NAMESPACE,
                "user_id": USERS[hash(thread) % len(USERS)],
                "conversation_id": thread,
                "message_id": msg,
            }
        if op == "search":
            return "/v1/conversation.search", {"namespace": NAMESPACE, "query": self.text(6), "limit": 10}
        if op == "brief":
            return "/v1/session.brief_save", {
                "namespace": NAMESPACE,
                "brief_key": f"brief-{i % 20}",
                "sections": {"goal": f"soak goal {i % 20}", "status": f"step {i}: {self.text(12)}"},
                "use_llm": False,
            }
        return "/v1/conversation.append", {"namespace": NAMESPACE, **self.turn(i, f"{i} {self.text(30)}")}

    @staticmethod
    def turn(i: int, content: str) -> dict[str, str]:
        """The i-th turn: threads in turn, roles alternating, each thread one user's."""
        thread = f"t-{i % THREADS}"
        return {
            "thread_id": thread,
            "role": "user" if i % 2 else "assistant",
            "user_id": USERS[hash(thread) % len(USERS)],
            "content": content,
        }

    async def one(self, op: str) -> None:
        path, body = self.body(op)
        if path.endswith("append"):
            op = "append"
        elif path.endswith("search"):
            op = "search"
        t0 = time.perf_counter()
        try:
            answer = await self.client.post_json(path, body)
        except HttpError as exc:
            self.errors[f"{op}:{exc.status}"] += 1
            return
        except Exception as exc:  # connection refused/reset, timeout
            self.errors[f"{op}:{type(exc).__name__}"] += 1
            return
        self.latencies.setdefault(op, []).append(time.perf_counter() - t0)
        self.done += 1
        if op == "append" and isinstance(answer, dict):
            self.embedding[str(answer.get("embedding"))] += 1
            if answer.get("stored"):
                self.appended.append((answer["thread_id"], answer["msg_id"]))


async def closed_loop(load: Load, clients: int, seconds: float) -> float:
    """Ops answered per second from `clients` closed-loop clients."""
    start_done = load.done
    end = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < end:
            await load.one(load.pick())

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return (load.done - start_done) / (time.monotonic() - t0)


async def open_loop(load: Load, rate: float, seconds: float, max_inflight: int) -> int:
    """Requests leave every 1/rate s for `seconds`; returns how many were shed (all
    `max_inflight` slots busy)."""
    loop = asyncio.get_running_loop()
    inflight: set[asyncio.Task[None]] = set()
    shed = 0
    t = loop.time()
    end = t + seconds
    while t < end:
        t += 1.0 / rate
        await asyncio.sleep(max(0.0, t - loop.time()))
        if len(inflight) >= max_inflight:
            shed += 1
            continue
        task = loop.create_task(load.one(load.pick()))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.wait(inflight, timeout=120)
    return shed


async def sampler(
    supervisor: int,
    every: float,
    series: dict[str, Series],
    t0: float,
    stop: asyncio.Event,
    clickhouse_url: str,
    engine: list[tuple[float, dict[str, float]]],
) -> None:
    while True:
        now = time.monotonic() - t0
        for name, pid in serve_group(supervisor).items():
            mb = rss_mb(pid)
            if mb is None:
                continue
            s = series.setdefault(name, Series())
            if not s.pids or s.pids[-1] != pid:
                s.pids.append(pid)
            s.samples.append((now, mb[0]))
            s.anon.append((now, mb[1]))
            s.file.append((now, mb[2]))
        with contextlib.suppress(Exception):  # a busy or restarting endpoint: skip a sample
            engine.append((now, await asyncio.to_thread(engine_memory_mb, clickhouse_url)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
            return


# -- main ----------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000.0


def setup(stack: LoomStack) -> str:
    from loom.auth.tokens import mint
    from loom.store import namespaces
    from loom.store.clickhouse import connect

    ch = connect(stack.clickhouse_url, database="loom")
    namespaces.update(ch, NAMESPACE, conversation_logging_enabled=True)
    return str(mint(ch, [NAMESPACE], "admin", label="soak").token)


async def preload(load: Load, turns: int, log: Any) -> None:
    """`turns` turns appended in batches of 100 before anything is measured: with more
    than LOOM_CONVERSATION_SEARCH_EXACT_MAX_ROWS (10,000) in the namespace, searches use
    the HNSW indexes from the first minute, so the soak sees the steady state instead of
    the one-time switch from exact scans (the index cache filling) in its middle."""
    t0 = time.monotonic()
    for lo in range(0, turns, 100):
        batch = [load.turn(i, f"preload {i} {load.text(30)}") for i in range(lo, min(turns, lo + 100))]
        await load.client.post_json("/v1/conversation.append", {"namespace": NAMESPACE, "turns": batch})
    log(f"  preload: {turns} turns in {time.monotonic() - t0:.0f}s")


async def soak(args: argparse.Namespace, stack: LoomStack, log: Any) -> dict[str, Any]:
    token = setup(stack)
    client = LeanClient(stack.base_url, {"Authorization": f"Bearer {token}"}, timeout=60)
    load = Load(client, random.Random(args.seed), mix=args.mix)
    if args.preload_turns:
        await preload(load, args.preload_turns, log)
    assert stack.proc is not None
    supervisor = stack.proc.pid
    # Warm every path once (the model loads, the first parts, connections).
    for op in ("append", "append", "search", "save", "brief"):
        await load.one(op)
    if load.errors:
        raise RuntimeError(f"warm-up failed: {dict(load.errors)}")
    peak = args.rate * 2 if args.rate else 0.0
    if not args.rate:
        peak = await closed_loop(load, args.probe_clients, args.probe_seconds)
        log(
            f"  peak: {peak:.1f} ops/s from {args.probe_clients} closed-loop clients over {args.probe_seconds:.0f}s"
        )
    rate = args.rate or peak / 2
    # The figures below count the soak only.
    load.latencies.clear()
    load.errors.clear()
    load.embedding.clear()
    load.done = 0
    seconds = args.minutes * 60
    log(f"  soak: {rate:.1f} ops/s for {args.minutes:g} min, RSS every {args.sample_seconds:g}s")
    series: dict[str, Series] = {}
    engine: list[tuple[float, dict[str, float]]] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampling = asyncio.get_running_loop().create_task(
        sampler(supervisor, args.sample_seconds, series, t0, stop, stack.clickhouse_url, engine)
    )

    async def progress() -> None:
        while True:
            await asyncio.sleep(60)
            el = time.monotonic() - t0
            rss = ", ".join(f"{n} {s.samples[-1][1]:.0f}" for n, s in series.items() if s.samples)
            log(f"  [{el / 60:5.1f} min] done {load.done}, errors {sum(load.errors.values())}; RSS MB: {rss}")

    prog = asyncio.get_running_loop().create_task(progress())
    shed = await open_loop(load, rate, seconds, args.max_inflight)
    elapsed = time.monotonic() - t0
    prog.cancel()
    stop.set()
    await sampling
    await client.aclose()
    release: dict[str, Any] = {}
    if args.release_probe is not None and stack.clickhouse_url:
        endpoint = serve_group(supervisor).get("clickhouse-endpoint")
        log(f"  release probe: {args.release_probe:g}s after the load, then every cache dropped")
        release = await release_probe(stack.clickhouse_url, endpoint, args.release_probe)
    warmup = args.warmup_seconds if args.warmup_seconds is not None else max(60.0, seconds / 3)

    def after(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [p for p in points if p[0] >= warmup] or points

    procs: dict[str, Any] = {}
    for name, s in series.items():
        post = after(s.samples)
        slope = slope_mb_per_10min(post)
        procs[name] = {
            "pids": s.pids,
            "restarted": len(s.pids) > 1,
            "rss_start_mb": round(post[0][1], 1),
            "rss_end_mb": round(post[-1][1], 1),
            "rss_max_mb": round(max(mb for _, mb in s.samples), 1),
            "slope_mb_per_10min": round(slope, 2),
            "anon_start_end_mb": [round(after(s.anon)[0][1], 1), round(after(s.anon)[-1][1], 1)],
            "anon_slope_mb_per_10min": round(slope_mb_per_10min(after(s.anon)), 2),
            "file_start_end_mb": [round(after(s.file)[0][1], 1), round(after(s.file)[-1][1], 1)],
            "file_slope_mb_per_10min": round(slope_mb_per_10min(after(s.file)), 2),
            "flat": abs(slope) < args.flat_mb and len(s.pids) == 1,
            "samples": [[round(t, 1), round(mb, 1)] for t, mb in s.samples],
            "samples_anon_file": [
                [round(a[1], 1), round(f[1], 1)] for a, f in zip(s.anon, s.file, strict=True)
            ],
        }
    engine_summary: dict[str, Any] = {}
    for key in sorted({k for _, d in engine for k in d}):
        points = [(t, d[key]) for t, d in engine if key in d]
        post = after(points)
        engine_summary[key] = {
            "start_mb": round(post[0][1], 1),
            "end_mb": round(post[-1][1], 1),
            "slope_mb_per_10min": round(slope_mb_per_10min(post), 2),
        }
    ops = {
        op: {
            "answered": len(xs),
            "median_ms": round(pct(xs, 0.5), 1),
            "p99_ms": round(pct(xs, 0.99), 1),
        }
        for op, xs in sorted(load.latencies.items())
    }
    return {
        "peak_ops_per_s": round(peak, 1),
        "rate_ops_per_s": round(rate, 1),
        "minutes": args.minutes,
        "preload_turns": args.preload_turns,
        "mix": args.mix,
        "elapsed_s": round(elapsed, 1),
        "warmup_s": warmup,
        "flat_threshold_mb_per_10min": args.flat_mb,
        "answered": load.done,
        "errors": dict(load.errors),
        "errors_total": sum(load.errors.values()),
        "shed": shed,
        "embedding": dict(load.embedding),
        "ops": ops,
        "processes": procs,
        "engine_memory": engine_summary,
        "engine_samples": [[round(t, 1), {k: round(v, 2) for k, v in d.items()}] for t, d in engine],
        "release_probe": release,
    }


def render(r: dict[str, Any]) -> str:
    lines = [
        f"soak: {r['minutes']:g} min at {r['rate_ops_per_s']} ops/s (peak {r['peak_ops_per_s']} ops/s), "
        f"{r.get('preload_turns', 0)} turns preloaded, mix {r.get('mix', MIX)}, "
        f"answered {r['answered']}, errors {r['errors_total']} {r['errors'] or ''}, shed {r['shed']}",
        f"append embedding outcomes: {r['embedding']}",
        "",
        f"{'op':<8} {'answered':>9} {'median ms':>10} {'p99 ms':>9}",
    ]
    for op, o in r["ops"].items():
        lines.append(f"{op:<8} {o['answered']:>9} {o['median_ms']:>10} {o['p99_ms']:>9}")
    lines += [
        "",
        f"RSS (MB) after the {r['warmup_s']:.0f}s warm-up; slope by least squares over the post-warm-up "
        f"samples; flat = |slope| < {r['flat_threshold_mb_per_10min']} MB per 10 min and no restart",
        f"{'process':<22} {'start':>8} {'end':>8} {'max':>8} {'MB/10min':>9}  flat",
    ]
    for name, p in r["processes"].items():
        flag = "yes" if p["flat"] else ("RESTARTED" if p["restarted"] else "NO")
        lines.append(
            f"{name:<22} {p['rss_start_mb']:>8} {p['rss_end_mb']:>8} {p['rss_max_mb']:>8} "
            f"{p['slope_mb_per_10min']:>9}  {flag}"
        )
    lines += [
        "",
        "the same, split: anonymous memory (heap) and file-backed pages (mapped code and files)",
        f"{'process':<22} {'anon start':>10} {'anon end':>9} {'MB/10min':>9} {'file start':>11} {'file end':>9} {'MB/10min':>9}",
    ]
    for name, p in r["processes"].items():
        (a0, a1), (f0, f1) = p["anon_start_end_mb"], p["file_start_end_mb"]
        lines.append(
            f"{name:<22} {a0:>10} {a1:>9} {p['anon_slope_mb_per_10min']:>9} {f0:>11} {f1:>9} "
            f"{p['file_slope_mb_per_10min']:>9}"
        )
    if r.get("engine_memory"):
        lines += [
            "",
            "embedded engine's own account (MB, after the warm-up)",
            f"{'':<34} {'start':>8} {'end':>8} {'MB/10min':>9}",
        ]
        for key, e in r["engine_memory"].items():
            lines.append(f"{key:<34} {e['start_mb']:>8} {e['end_mb']:>8} {e['slope_mb_per_10min']:>9}")
    if r.get("release_probe"):
        rp = r["release_probe"]
        first = dict(r["engine_samples"][0][1]) if r.get("engine_samples") else {}
        endpoint = r["processes"].get("clickhouse-endpoint")
        if endpoint and endpoint["samples"]:
            first["rss"], first["rss_anon"] = endpoint["samples"][0][1], endpoint["samples_anon_file"][0][0]
        lines += [
            "",
            f"release probe: the endpoint at the soak's first sample, {rp['settle_s']:g}s after the load, "
            "and after every cache dropped + jemalloc purged (MB; counts for count_*)",
            f"{'':<34} {'first':>8} {'settled':>8} {'dropped':>8}",
        ]
        for key in sorted(rp["settled"]):
            f = first.get(key, float("nan"))
            lines.append(
                f"{key:<34} {f:>8.1f} {rp['settled'][key]:>8.1f} {rp['caches_dropped'].get(key, 0):>8.1f}"
            )
    return "\n".join(lines)


def parse_mix(text: str) -> dict[str, float]:
    mix = {op: float(share) for op, _, share in (part.partition("=") for part in text.split(","))}
    if not set(mix) <= set(MIX) or abs(sum(mix.values()) - 1.0) > 1e-6:
        raise argparse.ArgumentTypeError(f"ops of {sorted(MIX)} with shares summing to 1")
    return mix


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.studies.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, help="ops/s to drive (default: half the measured peak)")
    p.add_argument("--probe-seconds", type=float, default=30.0)
    p.add_argument("--probe-clients", type=int, default=32)
    p.add_argument("--max-inflight", type=int, default=64)
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--warmup-seconds", type=float, help="default: the first third of the run, at least 60 s")
    p.add_argument("--flat-mb", type=float, default=2.0, help="flat: |slope| under this many MB per 10 min")
    p.add_argument("--embedder", default="minilm")
    p.add_argument(
        "--mix",
        type=parse_mix,
        default=dict(MIX),
        help="op=share,... of append, search, save, brief (default: the mix above); e.g. no searches: "
        "append=0.8,save=0.134,brief=0.066",
    )
    p.add_argument(
        "--preload-turns",
        type=int,
        default=0,
        help="turns appended before the probe (12000: past the exact-scan bound)",
    )
    p.add_argument(
        "--release-probe",
        type=float,
        metavar="SECONDS",
        help="after the load: wait SECONDS, read the endpoint, drop every engine cache, read it again",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--tag", default="", help="added to the result file names")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for `loom serve` and its children (repeatable)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    extra = dict(kv.split("=", 1) for kv in args.env)
    stack = LoomStack(embedder=args.embedder, env={"LOOM_LOG_LEVEL": "WARNING", **extra})
    log(f"soak: starting loom serve (cores {os.cpu_count()}, load {os.getloadavg()[0]:.1f})")
    try:
        stack.start(log)
        result = asyncio.run(soak(args, stack, log))
    finally:
        stack.stop()
    result["machine"] = {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()}
    result["env"] = extra
    text = render(result)
    save_run(
        args.out,
        f"{datetime.now(UTC):%Y-%m-%d}-soak-{args.minutes:g}m{('-' + args.tag) if args.tag else ''}",
        result,
        text,
    )
    return 0 if all(p["flat"] for p in result["processes"].values()) else 2


if __name__ == "__main__":
    raise SystemExit(main())
