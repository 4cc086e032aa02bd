"""What migration 016's view costs an append flush: a 32-turn transcript insert, timed
with the postings view attached and detached, in alternating rounds on a private
embedded endpoint (bench/datagen.py turns).

    .venv/bin/python bench/postings_insert_cost.py [--rounds 2] [--inserts 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import datagen  # noqa: E402
from loom.clock import next_version  # noqa: E402
from loom.embedded.clickhouse_endpoint import start_endpoint  # noqa: E402
from loom.settings import Settings  # noqa: E402
from loom.store import conversations as conv_store  # noqa: E402
from loom.store.clickhouse import connect  # noqa: E402
from loom.store.schema import prepare  # noqa: E402

FLUSH = 32


def _batch(turns: list[datagen.Turn], i: int, ns: str) -> list[conv_store.Turn]:
    return [
        conv_store.Turn(
            namespace=ns,
            agent="default",
            thread_id=t["thread_id"],
            msg_id=t["msg_id"],
            ts=datetime.now(UTC),
            role=t["role"],
            content=t["content"],
            version=next_version(),
        )
        for t in turns[i * FLUSH : (i + 1) * FLUSH]
    ]


def _run(ch: Any, turns: list[datagen.Turn], label: str, ns: str, lo: int, hi: int) -> None:
    xs = []
    for i in range(lo, hi):
        rows = _batch(turns, i, ns)
        t0 = time.perf_counter()
        conv_store.insert(ch, rows)
        xs.append((time.perf_counter() - t0) * 1000)
    xs.sort()
    print(
        f"{label}: {FLUSH}-turn insert median {statistics.median(xs):.1f} ms  p90 {xs[int(0.9 * len(xs))]:.1f} ms"
        f"  [load avg {os.getloadavg()[0]:.1f}]",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inserts", type=int, default=20, help="inserts per measurement")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loomic-", dir="/tmp"))
    endpoint = start_endpoint(home / "clickhouse")
    try:
        settings = Settings(home=home, clickhouse_url=endpoint.url, embedder="fake")
        prepare(settings, settings.clickhouse_url)
        ch = connect(endpoint.url, database=settings.clickhouse_database)
        n = args.inserts
        turns = datagen.turns(FLUSH * n * 2 * args.rounds, 7, "ic")
        for r in range(args.rounds):
            base = 2 * n * r
            _run(ch, turns, "with the postings view   ", f"with{r}", base, base + n)
            ch.command("DETACH TABLE conversation_terms_mv")
            try:
                _run(ch, turns, "without the postings view", f"without{r}", base + n, base + 2 * n)
            finally:
                ch.command("ATTACH TABLE conversation_terms_mv")
    finally:
        endpoint.stop()


if __name__ == "__main__":
    main()
