"""What the transcript's postings cost an append flush: a 32-turn transcript insert on a
private embedded endpoint (bench/datagen.py turns), in alternating rounds of
  - "python": the postings tokenised in Python and inserted first (loom.store.conversations.insert,
    loom.store.transcript_postings: what Loom does since migration 019);
  - "view": migration 016's materialized view, recreated here, writing them inside the insert;
  - "none": no postings at all (the floor).

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

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import datagen  # noqa: E402
from clickhouse_schema.runner import MIGRATIONS_DIR  # noqa: E402
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


def _view_sql() -> str:
    """Migration 016's view, as it was created (its statement names the transcript)."""
    sql = (MIGRATIONS_DIR / "016_transcript_terms.sql").read_text()
    view = next(part for part in sql.split(";") if "CREATE MATERIALIZED VIEW" in part)
    return view.replace("{on_cluster}", "")


def _insert(ch: Any, rows: list[conv_store.Turn], variant: str) -> None:
    if variant == "python":
        conv_store.insert(ch, rows)
    else:  # the view (attached or not) or nothing: the transcript insert alone
        conv_store.TABLE.insert(ch, rows)


def _cpu(engine: psutil.Process) -> float:
    """CPU seconds so far of this process (the writer) and the endpoint (the engine)."""
    own = time.process_time()
    t = engine.cpu_times()
    return own + t.user + t.system


def _run(
    ch: Any, engine: psutil.Process, turns: list[datagen.Turn], variant: str, ns: str, lo: int, hi: int
) -> tuple[list[float], float]:
    """Each insert's wall ms, and the CPU ms per insert (writer and engine together: it
    does not depend on how busy the machine is, as the wall time does)."""
    xs = []
    c0 = _cpu(engine)
    for i in range(lo, hi):
        rows = _batch(turns, i, ns)
        t0 = time.perf_counter()
        _insert(ch, rows, variant)
        xs.append((time.perf_counter() - t0) * 1000)
    return xs, (_cpu(engine) - c0) * 1000 / (hi - lo)


VARIANTS = ("python", "view", "none")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inserts", type=int, default=20, help="inserts per variant and round")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loomic-", dir="/tmp"))
    endpoint = start_endpoint(home / "clickhouse")
    try:
        settings = Settings(home=home, clickhouse_url=endpoint.url, embedder="fake")
        prepare(settings, settings.clickhouse_url)
        ch = connect(endpoint.url, database=settings.clickhouse_database)
        n = args.inserts
        turns = datagen.turns(FLUSH * n * len(VARIANTS) * args.rounds, 7, "ic")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
        engine = psutil.Process(endpoint.process.pid)
        block = 0
        for _ in range(args.rounds):
            for variant in VARIANTS:
                if variant == "view":
                    ch.command(_view_sql())
                try:
                    xs, per_insert = _run(ch, engine, turns, variant, variant, block * n, (block + 1) * n)
                    times[variant] += xs
                    cpu[variant].append(per_insert)
                finally:
                    ch.command("DROP VIEW IF EXISTS conversation_terms_mv")
                block += 1
        floor = statistics.median(times["none"])
        cpu_floor = statistics.median(cpu["none"])
        print(
            f"{FLUSH}-turn transcript insert, {args.rounds} rounds x {n} inserts per variant "
            f"[load avg {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores]"
        )
        for variant, xs in times.items():
            xs.sort()
            med = statistics.median(xs)
            print(
                f"  {variant:<7} median {med:6.1f} ms  p90 {xs[int(0.9 * len(xs))]:6.1f} ms  "
                f"({med / floor:.2f}x the insert alone)  CPU {statistics.median(cpu[variant]):6.1f} ms "
                f"({statistics.median(cpu[variant]) / cpu_floor:.2f}x)"
            )
    finally:
        endpoint.stop()


if __name__ == "__main__":
    main()
