"""What the embedding recovery pass costs at scale (loom.ops.embedding.recovery).

    .venv/bin/python -m bench.recovery_bench [--turns 200000] [--namespaces 50] [--repeat 5]

On a private embedded endpoint and Redis: a history of `--turns` user/assistant turns
(inserted over the past day, merged into large parts, each with an embedding row), then
a minute's worth of new appends (1,000 turns, 1% of them left without an embedding row,
as a crash leaves them). Measured, medians of `--repeat`:

* steady state: one pass over the new minute (position at the end of the history), the
  way the cron job runs every minute: time, rows read by its page query;
* for comparison, what a pass without a position reads: every embedded-role turn of
  the table (a scan per pass);
* the first pass ever (no position: the whole history once), for reference.

The machine is shared (2 cores): figures are noisy; compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.private_stack import private_services
from loom.clock import next_version
from loom.ops.embedding.recovery import recover
from loom.ops.embedding.writer import model_from_embedder
from loom.providers.embedders import FakeEmbedder
from loom.store import conversations as conv_store
from loom.store import embed_recovery
from loom.store import embeddings as emb_store

BATCH = 20_000


def _turn(ns: str, thread: str, msg: str, text: str) -> conv_store.Turn:
    return conv_store.Turn(
        namespace=ns,
        agent="default",
        thread_id=thread,
        msg_id=msg,
        ts=datetime.now(UTC),
        role="user",
        content=text,
        version=next_version(),
    )


def _emb(t: conv_store.Turn) -> emb_store.EmbeddingRow:
    # An error row (no vector): the pass only asks whether a row exists.
    return emb_store.EmbeddingRow(
        namespace=t.namespace,
        thread_id=t.thread_id,
        msg_id=t.msg_id,
        agent=t.agent,
        role=t.role,
        run_id="",
        user_id="",
        ts=t.ts,
        text=t.content,
        embedding=[],
        model="",
        error="embedder_unavailable: x",
        version=next_version(),
    )


def load_history(ch: Any, turns: int, namespaces: int) -> None:
    start = datetime.now(UTC) - timedelta(days=1)
    for lo in range(0, turns, BATCH):
        rows, embs = [], []
        for i in range(lo, min(turns, lo + BATCH)):
            t = _turn(
                f"ns{i % namespaces}", f"th{(i // namespaces) % 500}", f"m{i}", f"history turn {i} " * 4
            )
            rows.append([*t.row(), start + timedelta(seconds=i * 80_000 / turns)])  # spread over the day
            embs.append(_emb(t))
        ch.insert(
            "conversations",
            rows,
            column_names=[*conv_store.COLUMNS, "created_at"],
            column_type_names=[*conv_store.COLUMN_TYPES, "DateTime64(3, 'UTC')"],
        )
        emb_store.insert(ch, embs)
    ch.command("OPTIMIZE TABLE conversations FINAL")
    ch.command("OPTIMIZE TABLE conversation_embeddings FINAL")


def new_minute(ch: Any, namespaces: int, n: int, round_: int) -> None:
    """`n` appends in flushes of 32, 1% of them without an embedding row."""
    for lo in range(0, n, 32):
        turns = [
            _turn(f"ns{i % namespaces}", f"live{round_}-{i % 40}", f"r{round_}-{i}", f"new turn {i}")
            for i in range(lo, min(n, lo + 32))
        ]
        conv_store.insert(ch, turns)
        emb_store.insert(ch, [_emb(t) for t in turns if int(t.msg_id.rsplit("-", 1)[1]) % 100 != 7])


def page_read_rows(ch: Any, after: embed_recovery.Position | None, upto: datetime) -> int:
    """Rows the pass's page query reads from `after` (None: every turn, a scan)."""
    where = "created_at <= {upto:DateTime64(3, 'UTC')} AND (role IN ('user', 'assistant') OR is_summary)"
    params: dict[str, Any] = {"upto": upto}
    if after is not None:
        where += " AND created_at >= {at:DateTime64(3, 'UTC')}"
        params["at"] = after.created_at
    sql = f"SELECT namespace, thread_id, msg_id FROM conversations WHERE {where}"
    if after is not None:
        sql += " ORDER BY created_at LIMIT 1000"
    result = ch.query(sql, parameters=params)
    return int(result.summary.get("read_rows", -1))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200_000)
    ap.add_argument("--namespaces", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    async with private_services("loomrb-", "loom_recovery_bench") as svc:
        ch = svc.ch
        model = model_from_embedder(FakeEmbedder)
        t0 = time.perf_counter()
        load_history(ch, args.turns, args.namespaces)
        print(
            f"history: {args.turns:,} turns in {args.namespaces} namespaces, loaded and merged in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        t0 = time.perf_counter()
        first = await recover(svc, model, grace_s=0, max_pages=10**6)
        print(
            f"first pass ever (whole history): {time.perf_counter() - t0:.2f} s, scanned {first.scanned:,}, "
            f"embedded {first.embedded}"
        )
        steady, reads, scans, scan_s, found = [], [], [], [], []
        for r in range(args.repeat):
            pos = await svc.run(embed_recovery.position, ch)
            new_minute(ch, args.namespaces, 1_000, r)
            upto = await svc.run(embed_recovery.horizon, ch, 0.0)
            reads.append(page_read_rows(ch, pos, upto))
            t0 = time.perf_counter()
            scans.append(page_read_rows(ch, None, upto))
            scan_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = await recover(svc, model, grace_s=0, max_pages=10**6)
            steady.append(time.perf_counter() - t0)
            found.append(report.embedded)
        print(
            f"steady pass over a new minute (1,000 turns, 10 orphans): median {statistics.median(steady) * 1000:.0f} ms"
            f" (runs: {', '.join(f'{s * 1000:.0f}' for s in steady)}), embedded {found}"
        )
        print(f"  its page query read: median {statistics.median(reads):,.0f} rows")
        print(
            f"  a scan of every turn instead: median {statistics.median(scans):,.0f} rows, "
            f"{statistics.median(scan_s) * 1000:.0f} ms"
        )
        print(
            f"  rows read ratio (pass / scan): {statistics.median(reads) / max(1, statistics.median(scans)):.3f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
