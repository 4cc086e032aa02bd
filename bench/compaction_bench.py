"""conversation.compact on 200-turn threads, with a stand-in summarizer answering in 50 ms.

Run: ``.venv/bin/python bench/compaction_bench.py [--rounds N] [--concurrent N]``

Starts its own backends (the embedded ClickHouse endpoint and a redis-server in a
temporary directory, or LOOM_TEST_CLICKHOUSE_URL / LOOM_TEST_REDIS_URL), the schema, an
in-process arq worker (the production build_worker, fake embedder) and the local
stand-in chat server (tests/providers/standin.py) whose answers are delayed 50 ms; the
API is driven in-process over ASGI. Each round appends a fresh 200-turn thread, then
times conversation.compact end to end (enqueue, job, summarizer, embed, retirement,
answer) and the same minus the model call as the worker's LLM saw it ("everything but
the model"). Then N threads are compacted concurrently while single-turn appends run on
other threads, and the appends' p99 is compared with the same appends alone.
Prints medians; figures on a shared 2-core box are noisy.
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

from loom.api.app import create_app  # noqa: E402
from loom.auth.tokens import mint  # noqa: E402
from loom.services import open_services  # noqa: E402
from loom.settings import Settings  # noqa: E402
from loom.store import namespaces  # noqa: E402
from loom.store.schema import prepare  # noqa: E402
from bench.compaction_profile import STEPS, Profiler, steps_of  # noqa: E402
from tests.providers.standin import StandInServer  # noqa: E402

MODEL_DELAY_S = 0.05


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report(label: str, ms: list[float]) -> None:
    print(f"{label:<62} n={len(ms):<4} p50={statistics.median(ms):8.1f} ms  p99={pct(ms, 0.99):8.1f} ms")


class TimedLLM:
    """The worker's LLM, timing each call (the model's share of a compaction)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.configured = inner, "timed", True
        self.spent: list[float] = []

    async def complete(self, messages: Any, **kw: Any) -> str:
        t0 = time.perf_counter()
        try:
            return str(await self.inner.complete(messages, **kw))
        finally:
            self.spent.append(time.perf_counter() - t0)


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
        if not redis_url:
            server = start_redis(home / "redis")
            started.append(server)
            redis_url = server.url
        with StandInServer() as standin:
            standin.set_handler(
                standin.CHAT,
                lambda req: standin.chat_ok(
                    "They planned the storage migration and agreed on a Friday cutover."
                ).delayed(MODEL_DELAY_S),
            )
            settings = Settings(
                home=home,
                clickhouse_url=ch_url,
                redis_url=redis_url,
                embedder="fake",
                llm="openai",
                llm_url=standin.url,
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


async def bench(svc: Any, worker: Any, args: argparse.Namespace) -> None:
    ns = f"bench{secrets.token_hex(3)}"
    namespaces.update(svc.ch, ns, conversation_logging_enabled=True)
    token = mint(svc.ch, [ns], "writer").token
    headers = {"Authorization": f"Bearer {token}"}
    timed = TimedLLM(worker.ctx["loom"].llm)
    worker.ctx["loom"].llm = timed
    profiler = Profiler()
    profiler.install(worker.ctx["loom"])
    steps: dict[str, dict[str, float]] = {}
    app = create_app(svc)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=120
        ) as client,
    ):

        async def thread(th: str, n: int) -> None:
            turns = [
                {
                    "thread_id": th,
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"turn {i} of {th}: the storage cluster migration checklist, step {i}",
                }
                for i in range(n)
            ]
            r = await client.post(
                "/v1/conversation.append", headers=headers, json={"namespace": ns, "turns": turns}
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

        for i in range(3):  # warm-up
            await thread(f"warm{i}", 200)
            await compact(f"warm{i}")
        e2e, rest = [], []
        for i in range(args.rounds):
            await thread(f"r{i}", 200)
            timed.spent.clear()
            took = await compact(f"r{i}")
            e2e.append(took * 1000)
            rest.append((took - sum(timed.spent)) * 1000)
        print(
            f"200-turn thread, keep_recent 10, stand-in summarizer {MODEL_DELAY_S * 1000:.0f} ms, fake embedder"
        )
        report("conversation.compact end to end", e2e)
        report("conversation.compact, everything but the model", rest)
        profiled = [steps[f"r{i}"] for i in range(args.rounds) if f"r{i}" in steps]
        print("steps (median ms over the rounds):")
        for step in STEPS:
            vals = [p.get(step, 0.0) for p in profiled]
            if vals:
                print(f"  {step:<18} {statistics.median(vals):8.1f}")

        async def appends(tag: str, n: int) -> list[float]:
            out: list[float] = []

            async def one(k: int) -> None:
                for j in range(n):
                    out.append(await append_one(f"{tag}-a{k}", j))

            await asyncio.gather(*(one(k) for k in range(4)))
            return [s * 1000 for s in out]

        alone = await appends("alone", args.appends)
        for k in range(args.concurrent):
            await thread(f"c{k}", 200)
        results = await asyncio.gather(
            appends("busy", args.appends), *(compact(f"c{k}") for k in range(args.concurrent))
        )
        busy = results[0]
        report("append alone (4 writers)", alone)
        report(f"append while {args.concurrent} threads are compacted", busy)
        print(f"append p99 ratio (with / without compaction): {pct(busy, 0.99) / pct(alone, 0.99):.2f}")
        report(f"{args.concurrent} concurrent compactions, each end to end", [s * 1000 for s in results[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--appends", type=int, default=25, help="appends per writer (4 writers)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loomc-", dir="/tmp"))
    try:
        asyncio.run(run(args, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
