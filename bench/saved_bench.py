"""conversation.search_saved_messages on the whole embedded stack: latency per mode.

Run: ``.venv/bin/python bench/saved_bench.py [--queries 300] [--other 20000] [--concurrency 1]``

It starts Loom as ``loom serve`` does, in a temporary LOOM_HOME (bench/loom_stack.py: the
embedded ClickHouse endpoint, the embedded Redis, one arq worker, the API under uvicorn,
the real MiniLM embedder), then bulk-loads, through the store's insert functions (so the
per-user indexes are fed by their materialized views exactly as in production):

* ``bench-saved``: user ``saver`` with 10,000 saved messages, three other users with
  2,000 each (bench/datagen.py's saved set: realistic lengths, 6 % over 2,000
  characters, rare tokens such as ticket ids), plus ``--other`` recorded, unsaved
  turns of other users in the same namespace;
* vectors: real MiniLM vectors for the messages the queries are made from and a pool of
  2,000 more (cached under bench/.cache), the rest derived from them (datagen.derive).

Queries (datagen.saved_queries): ~50 % paraphrases, ~30 % a rare token of the message,
~20 % a phrase from deep in a long message. Each mode (hybrid, semantic, lexical) runs
them from `--concurrency` closed-loop clients after a warm-up, over keep-alive HTTP; the
query embedding (MiniLM, in the API process) is part of every hybrid and semantic
request. It reports p50/p95/p99 and hit@10 (the message a query was made from is in the
top 10), with the load average beside them: the machine has 2 cores and is shared.

Target: hybrid p95 <= 60 ms for the 10,000-message user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import datagen  # noqa: E402
from bench.append_bench import Conn  # noqa: E402
from bench.loom_stack import LoomStack  # noqa: E402

MODES = ("hybrid", "semantic", "lexical")
AGENT = "default"
LOAD_BATCH = 5_000


def log(msg: str) -> None:
    print(msg, flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_by_process(pids: Sequence[int]) -> dict[str, float]:
    """CPU time (user + system) each of the stack's processes used so far, by role: per
    query, it shows what a request costs independently of the other load on a shared
    machine (the idle stack's own use, measured apart, is subtracted)."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = (
            "clickhouse"
            if "clickhouse_endpoint" in cmd
            else "api"
            if "uvicorn" in cmd
            else "worker"
            if " worker" in cmd
            else "redis"
            if "redis" in cmd
            else "serve"
        )
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    return sum(cpu_by_process(pids).values())


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


# -- data ------------------------------------------------------------------------------------


def dataset(
    seed: int, n_other: int, n_queries: int
) -> tuple[list[dict[str, Any]], np.ndarray, list[dict[str, Any]]]:
    saved = datagen.saved_turns(seed)
    other = datagen.turns(n_other, seed, datagen.SAVED_NS)  # recorded, never saved
    rows = saved + other
    saver = [t for t in saved if t["user_id"] == datagen.SAVER]
    queries = datagen.saved_queries(saver, n_queries, seed)
    emb_idx = [i for i, t in enumerate(rows) if datagen.embeddable(t)]
    texts = [datagen.embed_text(rows[i]) for i in emb_idx]
    pos = {i: p for p, i in enumerate(emb_idx)}
    by_msg = {rows[i]["msg_id"]: i for i in emb_idx}
    real = sorted({pos[by_msg[q["source"]]] for q in queries} | set(range(min(2_000, len(emb_idx)))))
    vecs, _ = datagen.vectors_for(texts, real=real, seed=seed, log=log)
    vectors = np.zeros((len(rows), datagen.DIM), dtype=np.float32)
    vectors[emb_idx] = vecs
    lengths = [len(t["content"]) for t in saver]
    kinds = ", ".join(
        f"{k} {sum(q['kind'] == k for q in queries)}" for k in ("paraphrase", "rare_token", "deep_phrase")
    )
    log(
        f"  data: {len(saved):,} saved ({len(saver):,} of {datagen.SAVER}: median {statistics.median(lengths):.0f} "
        f"chars, {sum(n > 2000 for n in lengths):,} over 2,000) + {len(other):,} unsaved turns; "
        f"{len(queries)} queries ({kinds})"
    )
    return rows, vectors, queries


def bulk_load(
    clickhouse_url: str,
    rows: Sequence[dict[str, Any]],
    vectors: np.ndarray,
    model_id: str,
    *,
    database: str = "loom",
) -> float:
    from loom.clock import next_version
    from loom.ops.conversation.common import EMBEDDED_ROLES, embed_text
    from loom.sensitivity import reads_as_high
    from loom.store import conversations, embeddings
    from loom.store.clickhouse import connect

    ch = connect(clickhouse_url, database=database)
    t0 = time.perf_counter()
    for lo in range(0, len(rows), LOAD_BATCH):
        conv: list[conversations.Turn] = []
        emb: list[embeddings.EmbeddingRow] = []
        for i in range(lo, min(len(rows), lo + LOAD_BATCH)):
            t = rows[i]
            ts = _ts(t["ts"])
            saved_at = _ts(t["saved_at"]) if t.get("saved_at") else None
            high = reads_as_high(t["content"])
            conv.append(
                conversations.Turn(
                    namespace=t["namespace"],
                    agent=AGENT,
                    thread_id=t["thread_id"],
                    msg_id=t["msg_id"],
                    ts=ts,
                    role=t["role"],
                    content=t["content"],
                    user_id=t["user_id"],
                    high_sensitivity=high,
                    is_saved=saved_at is not None,
                    saved_at=saved_at,
                    version=next_version(),
                )
            )
            if t["role"] in EMBEDDED_ROLES and not high:
                emb.append(
                    embeddings.EmbeddingRow(
                        namespace=t["namespace"],
                        thread_id=t["thread_id"],
                        msg_id=t["msg_id"],
                        agent=AGENT,
                        role=t["role"],
                        run_id="",
                        user_id=t["user_id"],
                        ts=ts,
                        text=embed_text(t["content"]),
                        embedding=vectors[i],
                        model=model_id,
                        is_saved=saved_at is not None,
                        saved_at=saved_at,
                        version=next_version(),
                    )
                )
        conversations.insert(ch, conv)
        embeddings.insert(ch, emb)
    took = time.perf_counter() - t0
    for table in ("conversations", "conversation_embeddings", "saved_docs", "saved_terms", "saved_vectors"):
        ch.command(f"OPTIMIZE TABLE {table} FINAL")
    counts = {
        t: ch.query(f"SELECT count() FROM {t} FINAL").result_rows[0][0]
        for t in ("conversations", "saved_docs", "saved_terms", "saved_vectors")
    }
    log(f"  loaded in {took:.1f}s (+ OPTIMIZE FINAL): {counts}")
    return took


def mint(stack: LoomStack) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom.cli.main",
            "token",
            "mint",
            "--namespace",
            datagen.SAVED_NS,
            "--role",
            "viewer",
        ],
        env=stack.env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out.stdout.decode().strip().splitlines()[-1]


# -- measuring --------------------------------------------------------------------------------


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


async def run_mode(
    port: int,
    token: str,
    mode: str,
    queries: Sequence[dict[str, Any]],
    concurrency: int,
    warmup: int,
    pids: Sequence[int],
) -> dict[str, Any]:
    conns = [Conn("127.0.0.1", port, token) for _ in range(concurrency)]
    latencies: list[float] = []
    hits = 0
    fallbacks = 0
    errors = 0

    async def one(conn: Conn, q: dict[str, Any], timed: bool) -> None:
        nonlocal hits, fallbacks, errors
        body = {
            "namespace": datagen.SAVED_NS,
            "user_id": datagen.SAVER,
            "query": q["text"],
            "limit": 10,
            "search_mode": mode,
        }
        t0 = time.perf_counter()
        status, answer = await conn.post("/v1/conversation.search_saved_messages", body)
        took = time.perf_counter() - t0
        if not timed:
            return
        if status != 200:
            errors += 1
            return
        latencies.append(took)
        hits += q["source"] in [h["message_id"] for h in answer["hits"]]
        fallbacks += answer["fallback_reason"] is not None

    for q in queries[:warmup]:
        await one(conns[0], q, False)
    todo = list(queries)
    started = time.perf_counter()

    async def client(conn: Conn) -> None:
        while todo:
            await one(conn, todo.pop(), True)

    load_before = load_avg()
    cpu_before = cpu_by_process(pids)
    await asyncio.gather(*(client(c) for c in conns))
    wall = time.perf_counter() - started
    cpu_after = cpu_by_process(pids)
    idle = await idle_cpu_per_second(pids)
    per_role = {k: cpu_after.get(k, 0.0) - v - idle.get(k, 0.0) * wall for k, v in cpu_before.items()}
    cpu = sum(per_role.values())
    for c in conns:
        await c.close()
    n = len(latencies)
    return {
        "mode": mode,
        "concurrency": concurrency,
        "queries": n,
        "errors": errors,
        "fallbacks": fallbacks,
        "p50_ms": round(pct(latencies, 0.50), 1),
        "p95_ms": round(pct(latencies, 0.95), 1),
        "p99_ms": round(pct(latencies, 0.99), 1),
        "qps": round(n / wall, 1) if wall else 0.0,
        "hit_at_10": round(hits / n, 3) if n else 0.0,
        "stack_cpu_ms_per_query": round(cpu * 1000 / max(n, 1), 1),
        "cpu_ms_per_query_by_process": {k: round(v * 1000 / max(n, 1), 1) for k, v in per_role.items()},
        "load_before": load_before,
        "load_after": load_avg(),
    }


async def idle_cpu_per_second(pids: Sequence[int], seconds: float = 2.0) -> dict[str, float]:
    """What the idle stack burns per second (the worker's queue polling and the like)."""
    before = cpu_by_process(pids)
    await asyncio.sleep(seconds)
    after = cpu_by_process(pids)
    return {k: (after.get(k, 0.0) - v) / seconds for k, v in before.items()}


async def measure(
    port: int,
    token: str,
    queries: Sequence[dict[str, Any]],
    concurrency: int,
    warmup: int,
    rounds: int,
    pids: Sequence[int],
) -> list[dict[str, Any]]:
    out = []
    for _ in range(rounds):
        for mode in MODES:
            res = await run_mode(port, token, mode, queries, concurrency, warmup, pids)
            log(
                f"  {mode:8} c={concurrency}: p50 {res['p50_ms']:6.1f} ms  p95 {res['p95_ms']:6.1f} ms  "
                f"p99 {res['p99_ms']:6.1f} ms  {res['qps']:6.1f} q/s  hit@10 {res['hit_at_10']:.3f}  "
                f"stack cpu {res['stack_cpu_ms_per_query']:5.1f} ms/q {res['cpu_ms_per_query_by_process']}  errors {res['errors']}  fallbacks {res['fallbacks']}  "
                f"load {res['load_before']} -> "
                f"{res['load_after']}"
            )
            out.append(res)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--other", type=int, default=20_000, help="unsaved turns of other users in the namespace")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the modes (interleaved against drift)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", action="store_true", help="leave LOOM_HOME in place")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()

    log(f"saved-message search bench (load avg {load_avg()}, {os.cpu_count()} cores)")
    rows, vectors, queries = dataset(args.seed, args.other, args.queries)
    stack = LoomStack(embedder="minilm", keep=args.keep)
    results: list[dict[str, Any]] = []
    try:
        stack.start(log)
        from loom.providers.embedders import MiniLMEmbedder

        bulk_load(stack.clickhouse_url, rows, vectors, MiniLMEmbedder.model_id)
        token = mint(stack)
        for c in args.concurrency:
            results += asyncio.run(
                measure(stack.port, token, queries, c, args.warmup, args.rounds, list(stack.pids))
            )
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC):%Y%m%d-%H%M%S}-saved.json"
    path.write_text(
        json.dumps(
            {"results": results, "cores": os.cpu_count(), "queries": len(queries), "other_turns": args.other},
            indent=2,
        )
    )
    log(f"results: {path}")


if __name__ == "__main__":
    main()
