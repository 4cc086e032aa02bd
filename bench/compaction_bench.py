"""conversation.compact on 200-turn threads and conversation_titler passes, with a
stand-in model answering in 50 ms (bench/README.md, "Compaction and the titler").

Run: ``.venv/bin/python bench/compaction_bench.py [--rounds 20] [--concurrent 32]
[--appends 40] [--titler-passes 5] [--out bench/results]``

Starts its own backends (the embedded ClickHouse endpoint and a redis-server in a
temporary directory, or LOOM_TEST_CLICKHOUSE_URL / LOOM_TEST_REDIS_URL), the schema, an
in-process arq worker (the production build_worker, fake embedder) and the local
stand-in chat server in a process of its own (bench/standin_process.py); the API is driven in-process over
ASGI. Figures:

1. one compaction at a time, end to end, everything but the model, the summary's
   embedding, and the median of each step (bench/compaction_profile.py), alternating
   with the job body as it was before session 13 (compaction_profile.previous_run);
   CPU per compaction by process (this one, the endpoint, Redis), each compaction
   started once the engine runs no merge; with --statements N, each statement of a
   compaction run N times: wall and CPU per call by process;
2. single-turn appends on other threads alone, while N threads are compacted at once
   (the compaction gate at its configured bound; with --unbounded, unbounded too), and
   alone again: p99 and p50 ratios, and when the slowest appends started;
3. titler passes over 10 untitled threads: wall time and everything but the model.

Prints medians and the load average, and writes the lines to
bench/results/<date>-compaction.txt. Figures on a shared 2-core box are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.compaction_profile import (  # noqa: E402
    STEPS,
    CpuMeter,
    Profiler,
    previous_run,
    statement_costs,
    steps_of,
)
from bench.standin_process import MODEL_DELAY_S, SUMMARY, chat_standin  # noqa: E402
from loom.api.app import create_app  # noqa: E402
from loom.auth.tokens import mint  # noqa: E402
from loom.services import open_services  # noqa: E402
from loom.settings import Settings  # noqa: E402
from loom.store import namespaces  # noqa: E402
from loom.store.schema import prepare  # noqa: E402

AGENT = "default"  # the agent the API names when a request names none


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


LINES: list[str] = []


def out(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


def report(label: str, ms: list[float]) -> None:
    out(f"{label:<62} n={len(ms):<4} p50={statistics.median(ms):8.1f} ms  p99={pct(ms, 0.99):8.1f} ms")


class TimedLLM:
    """The worker's LLM, timing each call (the model's share of a compaction)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.configured = inner, "timed", True
        self.spent: list[tuple[float, float]] = []  # (start, end) of each call

    async def complete(self, messages: Any, **kw: Any) -> str:
        t0 = time.perf_counter()
        try:
            return str(await self.inner.complete(messages, **kw))
        finally:
            self.spent.append((t0, time.perf_counter()))


async def run(args: argparse.Namespace, home: Path) -> None:
    from loom.embedded.clickhouse_endpoint import start_endpoint
    from loom.embedded.redis_server import start_redis
    from workers.main import build_worker

    started: list[Any] = []
    ch_url = os.environ.get("LOOM_TEST_CLICKHOUSE_URL", "")
    redis_url = os.environ.get("LOOM_TEST_REDIS_URL", "")
    try:
        if not ch_url:
            endpoint = start_endpoint(home / "clickhouse")
            started.append(endpoint)
            ch_url = endpoint.url
            args.pids["endpoint"] = endpoint.pid
        if not redis_url:
            server = start_redis(home / "redis")
            started.append(server)
            redis_url = server.url
            args.pids["redis"] = server.pid
        with chat_standin(SUMMARY, MODEL_DELAY_S) as llm_url:
            settings = Settings(
                home=home,
                clickhouse_url=ch_url,
                redis_url=redis_url,
                embedder="fake",
                llm="openai",
                llm_url=llm_url,
                llm_model="stand-in",
                clickhouse_database=f"loom_bench_{secrets.token_hex(4)}",
            )
            prepare(settings, ch_url)
            svc = await open_services(settings, ch_url, redis_url)
            worker = build_worker(
                settings, ch_url, redis_url, handle_signals=False, burst=False, cron_jobs=[]
            )
            task = asyncio.create_task(worker.async_run())
            while "loom" not in worker.ctx:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            try:
                await bench(svc, worker, args)
            finally:
                with contextlib.suppress(asyncio.CancelledError):  # jobs still winding down
                    await worker.close()
                with contextlib.suppress(BaseException):
                    await task
                await svc.close()
    finally:
        for proc in reversed(started):
            proc.stop()


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of the spans was open."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


async def bench(svc: Any, worker: Any, args: argparse.Namespace) -> None:
    from loom.ops.conversation.lifecycle import titling
    from loom.ops.conversation.lifecycle.compaction_gate import CompactionGate
    from workers.jobs import COMPACT_GATE

    ns = f"bench{secrets.token_hex(3)}"
    tns = f"titles{secrets.token_hex(3)}"
    for name in (ns, tns):
        namespaces.update(svc.ch, name, conversation_logging_enabled=True)
    token = mint(svc.ch, [ns, tns], "writer").token
    headers = {"Authorization": f"Bearer {token}"}
    wsvc = worker.ctx["loom"]
    timed = TimedLLM(wsvc.llm)
    wsvc.llm = timed
    profiler = Profiler()
    profiler.install(wsvc)
    steps: dict[str, dict[str, float]] = {}
    app = create_app(svc)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120
        ) as client,
    ):

        async def thread(th: str, n: int, namespace: str = ns) -> None:
            turns = [
                {
                    "thread_id": th,
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"turn {i} of {th}: the storage cluster migration checklist, step {i}",
                }
                for i in range(n)
            ]
            r = await client.post(
                "/v1/conversation.append", headers=headers, json={"namespace": namespace, "turns": turns}
            )
            assert r.status_code == 200, r.text

        async def compact(th: str) -> float:
            t0 = time.perf_counter()
            r = await client.post(
                "/v1/conversation.compact",
                headers=headers,
                json={"namespace": ns, "thread_id": th, "keep_recent": 10},
            )
            t1 = time.perf_counter()
            assert r.status_code == 200 and r.json()["summary_msg_id"], r.text
            rec = profiler.jobs.get(th)
            if rec is not None and "_end" in rec:
                steps[th] = steps_of(rec, t0, t1)
            return t1 - t0

        async def append_one(th: str, i: int) -> float:
            t0 = time.perf_counter()
            r = await client.post(
                "/v1/conversation.append",
                headers=headers,
                json={"namespace": ns, "thread_id": th, "role": "user", "content": f"ping {i} {th}"},
            )
            assert r.status_code == 200, r.text
            return time.perf_counter() - t0

        out(f"load average at start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
        for i in range(3):  # warm-up
            await thread(f"warm{i}", 200)
            await compact(f"warm{i}")

        # 1. One compaction at a time; rounds alternate with the job body as it was before
        # session 13 (bench/compaction_profile.previous_run) for a ratio in the same run.
        meter = CpuMeter(**args.pids)

        async def settled(timeout_s: float = 10.0) -> None:
            """Until the engine runs no merge (or timeout_s passed)."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            await asyncio.sleep(0.3)  # the append's own work (its embedding job) winds down
            while loop.time() < deadline:
                busy = await svc.run(
                    lambda: svc.ch.query("SELECT count() FROM system.merges").result_rows[0][0]
                )
                if not busy:
                    return
                await asyncio.sleep(0.1)

        if args.statements:
            await thread("stmt", 200)
            for line in await wsvc.run(statement_costs, wsvc, meter, ns, AGENT, "stmt", args.statements):
                out(line)

        e2e, rest, embed, legacy_e2e, legacy_rest = [], [], [], [], []
        cpu: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for i in range(args.rounds):
            for legacy in (False, True):
                th = f"{'l' if legacy else 'r'}{i}"
                await thread(th, 200)
                profiler.inner = previous_run if legacy else profiler.current
                timed.spent.clear()
                await settled()  # the thread's own inserts merged: their CPU is not the compaction's
                before = meter.now()
                took = await compact(th)
                cpu[legacy].append(CpuMeter.spent(before, meter.now()))
                model_s = sum(b - a for a, b in timed.spent)
                if legacy:
                    legacy_e2e.append(took * 1000)
                    legacy_rest.append((took - model_s) * 1000)
                else:
                    e2e.append(took * 1000)
                    rest.append((took - model_s) * 1000)
                    embed.append(steps.get(th, {}).get("summary_embed", 0.0))
        profiler.inner = profiler.current
        out(
            f"\n1. 200-turn thread, keep_recent 10, stand-in summarizer {MODEL_DELAY_S * 1000:.0f} ms, fake embedder"
        )
        report("conversation.compact end to end (target p50 <= 150)", e2e)
        report("everything but the model (the summarizer call) (<= 100)", rest)
        report("  of which the summary's embedding (fake embedder)", embed)
        report(
            "everything but the summarizer and the embedding",
            [r - e for r, e in zip(rest, embed, strict=True)],
        )
        report("the job as before session 13: end to end", legacy_e2e)
        report("the job as before session 13: everything but the model", legacy_rest)
        out(
            f"   ratio now / before (p50): end to end {statistics.median(e2e) / statistics.median(legacy_e2e):.2f}, "
            f"everything but the model {statistics.median(rest) / statistics.median(legacy_rest):.2f}"
        )
        for legacy in (False, True):
            # The mean: the kernel counts CPU in 10 ms ticks, too coarse for one compaction.
            per = "  ".join(f"{k} {statistics.fmean(c[k] for c in cpu[legacy]):6.1f}" for k in cpu[legacy][0])
            out(f"   CPU ms per compaction (mean), {'before' if legacy else 'now':<6}: {per}")
        now = [steps[f"r{i}"] for i in range(args.rounds) if f"r{i}" in steps]
        was = [steps[f"l{i}"] for i in range(args.rounds) if f"l{i}" in steps]
        out("   steps, median ms, now | before (steps that run at once overlap; '-' not a step there):")
        for step in STEPS:
            cols = []
            for profiled in (now, was):
                vals = [p[step] for p in profiled if step in p]
                cols.append(f"{statistics.median(vals):8.1f}" if vals else f"{'-':>8}")
            out(f"     {step:<18} {cols[0]} | {cols[1]}")

        # 2. Appends on other threads while 32 threads are compacted. Every phase's threads
        # are built first, so the phases without compactions run with the same backlog of
        # background merges (6,400 fresh turns and vectors) as the ones with them.
        async def appends(tag: str, n: int, spans: list[tuple[float, float]] | None = None) -> list[float]:
            got: list[float] = []
            t_start = time.perf_counter()

            async def one(k: int) -> None:
                for j in range(n):
                    t0 = time.perf_counter() - t_start
                    took = await append_one(f"{tag}-a{k}", j)
                    got.append(took)
                    if spans is not None:
                        spans.append((t0, took))

            await asyncio.gather(*(one(k) for k in range(4)))
            return [s * 1000 for s in got]

        async def busy(tag: str, bound: int) -> tuple[list[float], list[float], list[tuple[float, float]]]:
            wsvc.extras[COMPACT_GATE] = CompactionGate(bound, wsvc.settings.compact_pace)
            spans: list[tuple[float, float]] = []
            results = await asyncio.gather(
                appends(tag, args.appends, spans), *(compact(f"{tag}{k}") for k in range(args.concurrent))
            )
            return results[0], [s * 1000 for s in results[1:]], spans

        bound = wsvc.settings.compact_concurrency
        phases = (
            ["gated"]
            + (["unbounded"] if args.unbounded else [])
            + (["previous"] if args.previous_busy else [])
        )
        for tag in phases:
            for k in range(args.concurrent):
                await thread(f"{tag}{k}", 200)
        alone1 = await appends("alone1", args.appends)
        after, after_c, spans = await busy("gated", bound)
        alone2 = await appends("alone2", args.appends)
        if args.unbounded:
            before, before_c, _ = await busy("unbounded", 10_000)
        if args.previous_busy:  # the job body as before session 13, then appends alone again
            profiler.inner = previous_run
            prev, prev_c, _ = await busy("previous", bound)
            profiler.inner = profiler.current
            alone3 = await appends("alone3", args.appends)
        alone = alone1 + alone2
        out(
            f"\n2. {args.concurrent} threads compacted at once, 4 writers appending single turns to other threads"
        )
        report("append alone (before and after the busy phase)", alone)
        report("  of which before", alone1)
        report("  of which after", alone2)
        report(f"append during compactions, LOOM_COMPACT_CONCURRENCY={bound}", after)
        rows = [(f"concurrency {bound}", after)]
        if args.unbounded:
            report("append during compactions, unbounded (as before LOOM_COMPACT_CONCURRENCY)", before)
            rows.append(("unbounded", before))
        if args.previous_busy:
            report("append alone, after the phase with the job as before", alone3)
            report(f"append during compactions as before session 13, concurrency {bound}", prev)
            prev_alone = alone2 + alone3
            out(
                f"   as before session 13 (against the appends alone around it): p99 ratio "
                f"{pct(prev, 0.99) / pct(prev_alone, 0.99):5.2f}, p50 ratio "
                f"{statistics.median(prev) / statistics.median(prev_alone):5.2f}; now (against alone1 + alone2): "
                f"p50 ratio {statistics.median(after) / statistics.median(alone):5.2f}"
            )
            report(f"{args.concurrent} compactions as before session 13, each end to end", prev_c)
        for label, ms in rows:
            out(
                f"   append p99 ratio, {label:<16}: {pct(ms, 0.99) / pct(alone, 0.99):5.2f} "
                f"(p50 ratio {statistics.median(ms) / statistics.median(alone):5.2f}; target p99 <= 1.2)"
            )
        worst = sorted(spans, key=lambda s: -s[1])[:5]
        out(
            "   the slowest appends during compactions (started at s into the phase: ms): "
            + ", ".join(f"{t0:.1f}: {took * 1000:.0f}" for t0, took in worst)
        )
        report(f"{args.concurrent} compactions, each end to end, concurrency {bound}", after_c)
        if args.unbounded:
            report(f"{args.concurrent} compactions, each end to end, unbounded", before_c)

        # 3. Titler passes over 10 untitled threads each.
        per_pass = wsvc.settings.conversation_titler_max_threads_per_pass
        for k in range(args.titler_passes * per_pass):
            await thread(f"t{k}", 8, tns)
        walls, rests = [], []
        for _ in range(args.titler_passes):
            timed.spent.clear()
            t0 = time.perf_counter()
            got = await titling.titler_pass(wsvc, [tns])
            wall = time.perf_counter() - t0
            assert got.titled == per_pass, got
            walls.append(wall * 1000)
            rests.append((wall - _union_s(timed.spent)) * 1000)
        out(
            f"\n3. conversation_titler pass over {per_pass} untitled 8-turn threads, stand-in model {MODEL_DELAY_S * 1000:.0f} ms"
        )
        report("titler pass, wall", walls)
        report("titler pass, everything but the model (<= 200)", rests)
        out(f"load average at end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--appends", type=int, default=40, help="appends per writer and phase (4 writers)")
    parser.add_argument("--titler-passes", type=int, default=5)
    parser.add_argument(
        "--previous-busy",
        action="store_true",
        help="also a busy phase with the job body as before session 13 (then appends alone again)",
    )
    parser.add_argument(
        "--unbounded", action="store_true", help="also a busy phase with the compaction gate unbounded"
    )
    parser.add_argument(
        "--statements", type=int, default=0, help="also time each statement of a compaction this many times"
    )
    parser.add_argument(
        "--out",
        default="bench/results",
        help="directory for the figures (<date>-compaction.txt); '' for none",
    )
    args = parser.parse_args()
    args.pids = {}
    home = Path(tempfile.mkdtemp(prefix="loomc-", dir="/tmp"))
    started = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    out(f"# bench/compaction_bench.py {' '.join(sys.argv[1:])}, {started} UTC, {os.cpu_count()} cores")
    try:
        asyncio.run(run(args, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if args.out:
        path = Path(args.out) / f"{started}-compaction.txt"
        path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
        print(f"written to {path}")


if __name__ == "__main__":
    main()
