"""memory.search and context.pack latency at scale (loom.ops.memory).

    .venv/bin/python -m bench.memory_bench [--facts 100000] [--users 1000] [--queries 200] [--embedder minilm]

On a private embedded endpoint and Redis: `--facts` facts in one namespace spread over
`--users` users (memory is per user), each with a random unit vector stamped with the
query embedder's model id and a text of random vocabulary words (so BM25 has postings),
plus evidence rows (one per 10 facts). Then, for random users and queries, the op-level
latency of memory.search (hybrid: the query embedding, the vector leg, the BM25 leg, the
fusion and the re-read of the page) and of context.pack (4k-token budget, with a query),
both with the query embedding included. A second shape puts every fact under one user
(the worst case of the exact per-user vector scan).

The machine is shared (2 cores): figures are noisy; medians and p95 are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.embedded.clickhouse_endpoint import start_endpoint
from loom.embedded.redis_server import start_redis
from loom.ops.conversation import api_inline_embedder
from loom.ops.memory import context, facts
from loom.services import open_services
from loom.settings import Settings
from loom.store import evidence as ev_store
from loom.store import memories as store

BATCH = 10_000
WORDS = [f"w{i}" for i in range(5_000)] + [
    "ledger",
    "invoice",
    "billing",
    "kyoto",
    "coffee",
    "cello",
    "garden",
]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))


def load(ch: Any, ns: str, n: int, users: int, model: str, dim: int, seed: int) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    now = utcnow()
    for lo in range(0, n, BATCH):
        size = min(BATCH, n - lo)
        vecs = nrng.standard_normal((size, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        rows = [
            store.Fact(
                namespace=ns,
                user_id=f"u{(lo + i) % users}",
                memory_id=f"m{lo + i}",
                session_id="",
                run_id="",
                kind="",
                key="",
                text=_text(rng),
                source="set",
                evidence_ids=[],
                created_at=now,
                updated_at=now,
                model=model,
                embedding=vecs[i].tolist(),
                version=next_version(),
            )
            for i in range(size)
        ]
        store.insert(ch, rows)
        ev = [
            ev_store.Evidence(
                namespace=ns,
                user_id=f"u{(lo + i) % users}",
                evidence_id=f"e{lo + i}",
                session_id="",
                run_id="",
                source="messages",
                msg_id=f"m{lo + i}",
                role="user",
                content=_text(rng),
                high_sensitivity=False,
                ts=now,
                created_at=now,
                version=next_version(),
            )
            for i in range(0, size, 10)
        ]
        ev_store.insert(ch, ev)
    for table in ("memories", "memory_terms", "memory_evidence", "evidence_terms"):
        ch.command(f"OPTIMIZE TABLE {table} FINAL")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def measure(svc: Any, ns: str, users: int, queries: int, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed + 1)
    who = Principal("bench", (ns,), Role.viewer)
    out: dict[str, list[float]] = {"search": [], "pack": []}
    for _ in range(queries):
        user, q = f"u{rng.randrange(users)}", " ".join(rng.choice(WORDS) for _ in range(3))
        t0 = time.perf_counter()
        await facts.search(svc, who, ns, user, q, limit=10)
        out["search"].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        await context.pack(svc, who, ns, user, query=q, token_budget=4000)
        out["pack"].append((time.perf_counter() - t0) * 1000)
    return out


def report(label: str, figures: dict[str, list[float]]) -> None:
    for op, xs in figures.items():
        print(
            f"{label:<34} {op:<7} median {statistics.median(xs):7.1f} ms   p95 {pct(xs, 95):7.1f} ms   "
            f"n={len(xs)}"
        )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loommb-", dir="/tmp"))
    endpoint = start_endpoint(home / "clickhouse")
    redis = start_redis(home / "redis")
    try:
        settings = Settings(
            home=home,
            clickhouse_url=endpoint.url,
            redis_url=redis.url,
            embedder=args.embedder,
            clickhouse_database="loom_memory_bench",
        )
        from loom.store.schema import prepare

        prepare(settings, settings.clickhouse_url)
        svc = await open_services(settings, settings.clickhouse_url, settings.redis_url)
        probe = await api_inline_embedder.embed(svc, ["warm up the model"])
        assert probe.ok and probe.vectors, probe.error
        model, dim = probe.model_id, len(probe.vectors[0])
        for label, ns, users in (
            (f"{args.facts:,} facts / {args.users:,} users", "spread", args.users),
            (f"{args.facts:,} facts / 1 user", "one", 1),
        ):
            t0 = time.perf_counter()
            await svc.run(load, svc.ch, ns, args.facts, users, model, dim, args.seed)
            print(f"{label}: loaded in {time.perf_counter() - t0:.1f} s")
            await measure(svc, ns, users, 10, args.seed)  # warm-up
            report(label, await measure(svc, ns, users, args.queries, args.seed))
        await svc.close()
    finally:
        redis.stop()
        endpoint.stop()


if __name__ == "__main__":
    asyncio.run(main())
