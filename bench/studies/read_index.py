"""Question: What do the read index's rebuild of a namespace and one in-memory search cost at N
rows, and what would 1M turns take?

    python -m bench.studies.read_index [--rows 100000]

Result: printed; kept as bench/results/<date>-read-index-links.txt (the whole stack's figures
are in the harness's JSON).

The read index's own costs, link by link: its rebuild of one namespace from ClickHouse
(the read of conversation_embeddings FINAL, then the build in memory) and one search in
memory (exact ranking at that size), with nothing else running in the index.

``python -m bench.studies.read_index --rows 100000`` starts an embedded ClickHouse endpoint
in a temporary directory, writes `rows` embedding rows of one namespace (random unit
384-dimension vectors, 200-character texts: the size of the bench's turns), merges them,
then times the rebuild (best of --repeat) and --queries searches, and prints the rates and
what 1M turns would take at the measured rate (a linear extrapolation: both parts are one
pass over the rows).
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from loom.clock import next_version
from loom.embedded.clickhouse_endpoint import start_endpoint
from loom.read_index.vectors import NamespaceVectors, Wanted
from loom.settings import Settings
from loom.store import embeddings as emb_store
from loom.store import read_index as store
from loom.store.clickhouse import connect
from loom.store.schema import prepare

NS = "rebuild"
BATCH = 10_000


def _rows(rng: np.random.Generator, lo: int, hi: int) -> list[emb_store.EmbeddingRow]:
    vecs = rng.standard_normal((hi - lo, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ts = datetime.now(UTC)
    version = next_version()
    return [
        emb_store.EmbeddingRow(
            namespace=NS,
            thread_id=f"t{i // 20}",
            msg_id=f"m{i}",
            agent="bench",
            role="user",
            run_id="",
            user_id=f"u{i % 50}",
            ts=ts,
            text=(f"turn {i} " + "lorem ipsum dolor sit amet " * 8)[:200],
            embedding=vecs[i - lo],
            model="bench-model",
            version=version,
        )
        for i in range(lo, hi)
    ]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.studies.read_index")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--queries", type=int, default=200)
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loom-ri-bench-"))
    endpoint = start_endpoint(home / "clickhouse")
    try:
        settings = Settings(
            home=home, clickhouse_url=endpoint.url, clickhouse_database=f"ri_{secrets.token_hex(3)}"
        )
        prepare(settings, endpoint.url)
        ch = connect(endpoint.url, database=settings.clickhouse_database)
        rng = np.random.default_rng(7)
        t0 = time.perf_counter()
        for lo in range(0, args.rows, BATCH):
            emb_store.insert(ch, _rows(rng, lo, min(args.rows, lo + BATCH)))
        ch.command("OPTIMIZE TABLE conversation_embeddings FINAL")
        print(f"wrote {args.rows:,} embedding rows in {time.perf_counter() - t0:.1f}s")
        best_read = best_build = float("inf")
        vectors = NamespaceVectors()
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rows = store.rows(ch, NS)
            t1 = time.perf_counter()
            vectors = NamespaceVectors()
            vectors.load(rows)
            t2 = time.perf_counter()
            best_read, best_build = min(best_read, t1 - t0), min(best_build, t2 - t1)
        total = best_read + best_build
        print(
            f"rebuild of {len(vectors):,} rows: read {best_read:.2f}s + build {best_build:.2f}s = {total:.2f}s "
            f"({len(vectors) / total:,.0f} rows/s; 1M at this rate: {1_000_000 / (len(vectors) / total):.0f}s); "
            f"{vectors.nbytes / len(vectors):,.0f} bytes a row in memory"
        )
        qs = rng.standard_normal((args.queries, 384)).astype(np.float32)
        took = []
        for q in qs:
            t0 = time.perf_counter()
            vectors.search(q, Wanted(), 30)
            took.append(time.perf_counter() - t0)
        ms = np.asarray(took) * 1000
        print(
            f"search in memory, {len(vectors):,} rows, top 30: p50 {np.percentile(ms, 50):.2f} ms "
            f"p95 {np.percentile(ms, 95):.2f} ms"
        )
        ch.close()
    finally:
        endpoint.stop()


if __name__ == "__main__":
    main()
