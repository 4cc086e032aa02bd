"""The raw MiniLM rate: what the embedding model alone does on this machine.

Run: ``.venv/bin/python bench/model_rate.py [--threads N] [--seconds S]``

Prints the cold start (first embed, including the lazy load), the throughput in
texts/s for batches of 32 texts of ~200 and ~2,000 characters, and the median
latency of a single short query. No store, queue or API is involved, so this is
the ceiling the embedding worker cannot exceed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loom.providers.embedders.minilm import MiniLMEmbedder  # noqa: E402

_SAMPLE = (
    "the user asked about the deployment pipeline and whether the staging cluster "
    "could be rebuilt before friday because the migration of the billing service "
    "failed twice with a timeout while the database was locked by a long running "
    "report that nobody remembered scheduling last quarter so we agreed to move it"
)
WORDS = _SAMPLE.split()


def make_text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def throughput(emb: MiniLMEmbedder, texts: list[str], batch: int, seconds: float) -> float:
    done = 0
    t0 = time.perf_counter()
    i = 0
    while True:
        chunk = texts[i : i + batch]
        if len(chunk) < batch:
            i = 0
            chunk = texts[:batch]
        emb.embed(chunk)
        i += batch
        done += len(chunk)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--seconds", type=float, default=5.0, help="time per throughput measurement")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--queries", type=int, default=200, help="single queries timed for the median")
    args = ap.parse_args()

    rng = random.Random(42)
    emb = MiniLMEmbedder(intra_op_num_threads=args.threads, batch_size=args.batch)

    t0 = time.perf_counter()
    emb.embed(["cold start"])
    cold = time.perf_counter() - t0

    print(
        f"MiniLM {emb.model_id} dim={emb.dim} threads={args.threads} batch={args.batch} cpus={os.cpu_count()}"
    )
    print(f"cold start (lazy load + first embed): {cold * 1000:.0f} ms")

    for chars in (200, 2000):
        texts = [make_text(rng, chars) for _ in range(args.batch * 8)]
        emb.embed(texts[: args.batch])  # warm this shape
        rate = throughput(emb, texts, args.batch, args.seconds)
        print(f"throughput, ~{chars:>5,}-char texts: {rate:8.1f} texts/s")

    for lo, hi in ((20, 40), (60, 100)):
        queries = [make_text(rng, rng.randint(lo, hi)) for _ in range(args.queries)]
        for q in queries[:10]:
            emb.embed([q])
        lat = []
        for q in queries:
            t = time.perf_counter()
            emb.embed([q])
            lat.append(time.perf_counter() - t)
        lat.sort()
        p95 = lat[int(len(lat) * 0.95) - 1]
        print(
            f"single query ({lo}-{hi} chars) latency: median {statistics.median(lat) * 1000:.2f} ms, "
            f"p95 {p95 * 1000:.2f} ms"
        )


if __name__ == "__main__":
    main()
