"""Question: Do appends slow down while many threads are compacted (the compaction gate), with the
API, worker, engine and Redis as the separate processes `loom serve` starts?

    python -m bench.studies.compaction [--concurrent 32] [--appends 40] [--rounds 3]

Result: printed; kept as bench/results/<date>-compaction-stack-<rounds>r.txt (last:
2026-12-03-0945-compaction-stack-3r.txt).

Appends while 32 threads are compacted, through ``loom serve`` as a user runs it.

Driving the API and the arq worker inside the benchmark's own process would make a
burst of 32 compactions and the appends it times share one event loop and one
interpreter lock: a stall there would partly be the benchmark's own. Here the API, the worker,
the embedded ClickHouse endpoint and Redis are the processes ``loom serve`` starts
(bench/loom_stack.py), the summarizer is the local stand-in chat server answering in
50 ms (tests/providers/standin.py), and the client speaks HTTP. Per round: 4 writers
append single turns to their own threads (alone), then the same while
``--concurrent`` 200-turn threads are compacted at once (busy), then alone again. The
target: append p99 during compactions within 1.2x of its value without.

The stand-in summarizer runs in a process of its own, as a real provider would
(bench/studies/standin_process.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from bench.httpclient import LeanClient
from bench.loom_stack import LoomStack
from bench.studies.standin_process import MODEL_DELAY_S, SUMMARY, chat_standin

NAMESPACE = "bench-compact"
WRITERS = 4


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def line(label: str, xs: list[float]) -> str:
    return f"{label:<44} n={len(xs):<4} p50={statistics.median(xs):7.1f} ms  p99={pct(xs, 0.99):7.1f} ms"


def setup(stack: LoomStack) -> str:
    from loom.auth.tokens import mint
    from loom.store import namespaces
    from loom.store.clickhouse import connect

    ch = connect(stack.clickhouse_url, database="loom")
    namespaces.update(ch, NAMESPACE, conversation_logging_enabled=True)
    return str(mint(ch, [NAMESPACE], "admin", label="compaction-stack").token)


async def fill(client: LeanClient, thread_id: str, n: int) -> None:
    turns = [
        {
            "thread_id": thread_id,
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i} of {thread_id}: the storage cluster migration checklist, step {i}",
        }
        for i in range(n)
    ]
    await client.post_json("/v1/conversation.append", {"namespace": NAMESPACE, "turns": turns})


async def appends(
    client: LeanClient, tag: str, n: int, spans: list[tuple[float, float]] | None = None
) -> list[float]:
    """Each writer's append latencies (ms); `spans` gets (start s into the phase, ms) too."""
    got: list[float] = []
    t_phase = time.perf_counter()

    async def writer(k: int) -> None:
        for j in range(n):
            t0 = time.perf_counter()
            body = {
                "namespace": NAMESPACE,
                "thread_id": f"{tag}-a{k}",
                "role": "user",
                "content": f"ping {j} {tag}",
            }
            await client.post_json("/v1/conversation.append", body)
            got.append((time.perf_counter() - t0) * 1000)
            if spans is not None:
                spans.append((t0 - t_phase, got[-1]))

    await asyncio.gather(*(writer(k) for k in range(WRITERS)))
    return got


async def compact(client: LeanClient, thread_id: str) -> float:
    t0 = time.perf_counter()
    r = await client.post_json(
        "/v1/conversation.compact", {"namespace": NAMESPACE, "thread_id": thread_id, "keep_recent": 10}
    )
    assert r["summary_msg_id"], r
    return (time.perf_counter() - t0) * 1000


async def run(args: argparse.Namespace, stack: LoomStack) -> None:
    client = LeanClient(stack.base_url, {"Authorization": f"Bearer {setup(stack)}"}, timeout=120)
    alone: list[float] = []
    busy: list[float] = []
    compactions: list[float] = []
    spans: list[tuple[float, float]] = []
    for i in range(3):  # warm-up: the first compaction and appends pay for connections and caches
        await fill(client, f"warm{i}", 200)
        await compact(client, f"warm{i}")
    await appends(client, "warm", 5)
    for r in range(args.rounds):
        for k in range(args.concurrent):
            await fill(client, f"r{r}c{k}", 200)
        await asyncio.sleep(1.0)  # the fills' embedding jobs wind down
        alone += await appends(client, f"r{r}before", args.appends)
        during = asyncio.create_task(appends(client, f"r{r}busy", args.appends, spans))
        compactions += await asyncio.gather(*(compact(client, f"r{r}c{k}") for k in range(args.concurrent)))
        busy += await during
        alone += await appends(client, f"r{r}after", args.appends)
        print(f"  round {r + 1}: load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    await client.aclose()
    print(line("append alone (before and after each busy phase)", alone))
    print(line(f"append during {args.concurrent} compactions", busy))
    print(line("compaction end to end", compactions))
    worst = sorted(spans, key=lambda s: -s[1])[:8]
    print(
        "the slowest appends during compactions (s into the phase: ms): "
        + ", ".join(f"{t:.2f}: {ms:.0f}" for t, ms in worst)
    )
    print(
        f"append p99 ratio busy/alone {pct(busy, 0.99) / pct(alone, 0.99):.2f} (target <= 1.2), "
        f"p50 ratio {statistics.median(busy) / statistics.median(alone):.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--appends", type=int, default=40, help="appends per writer per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--embedder", default="fake")
    ap.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment for serve"
    )
    args = ap.parse_args()
    print(f"# bench/studies/compaction.py {vars(args)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load average at start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with chat_standin(SUMMARY, MODEL_DELAY_S) as llm_url:
        env = {"LOOM_LLM": "openai", "LOOM_LLM_URL": llm_url, "LOOM_LLM_MODEL": "stand-in"}
        env.update(kv.split("=", 1) for kv in args.env)
        stack = LoomStack(embedder=args.embedder, env=env)
        try:
            stack.start()
            asyncio.run(run(args, stack))
        finally:
            stack.stop()
    print(f"load average at end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
