"""Question: How long do conversation.redact and conversation.delete_message of one turn take in a
100k-1M-turn namespace, until unreadable and until gone?

    python -m bench.studies.redact [--turns 100000] [--rounds 7]

Result: bench/results/<date>-<time>-redact[-<turns>].{json,txt} (last:
2026-12-02-1636-redact-1m).

conversation.redact and conversation.delete_message of one turn in an N-turn namespace,
on the whole embedded stack, through the API.

Run: ``python -m bench.studies.redact [--turns 100000] [--rounds 7]`` (``--turns
1000000`` for a 1M-turn namespace: the load alone takes a while on 2 cores).

It starts Loom as ``loom serve`` does (bench/loom_stack.py, the fake embedder) and
bulk-loads the namespace as bench/studies/erasure.py does (INSERT ... SELECT inside
ClickHouse, so the derived tables are fed by their views; 100 users, threads of 20
turns, user and assistant turns with 384-dimension vectors, a tenth of the user turns
saved; OPTIMIZE FINAL, so every table is a few large parts, the worst case for a
rewrite). Then, one turn at a time (user turns spread over the namespace):

* ``redact``: ``conversation.redact`` of the turn's first 12 characters;
* ``delete``: ``conversation.delete_message`` of another turn.

Figures per op, medians (the machine has 2 cores and is shared: upper bounds, with the
load average):

* ``unreadable``: until no read finds the old text (the receipt's ``unreadable_ms``,
  timed by the server from the op's start: the new version written, the older versions
  hidden). The target: p50 <= 300 ms.
* ``answer``: the op's whole round trip, which also waits (up to 30 s) for the parts to
  be rewritten without the old versions (``gone_ms``; ``removal: pending`` when the
  engine was still at it then: right after a 1M-turn load its HNSW merges run for tens
  of minutes and a vector table's mutation waits for them).

After each op the bench checks the store: the turn's key has one version left in
loom.conversations and none older in the vector table, counting rows a lightweight
DELETE only hid (``apply_deleted_mask = 0``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.loom_stack import LoomStack  # noqa: E402
from bench.studies.erasure import (  # noqa: E402
    AGENT,
    MAIN_NS,
    add_settle_argument,
    bulk_load,
    load_avg,
    log,
    mint,
    settle,
)

USERS = 100
TARGET_MS = 300.0


def key_of(i: int, turns: int) -> tuple[str, str]:
    """(thread_id, msg_id) of turn `i` as bench/erasure_bench.bulk_load names it."""
    per = max(1, turns // USERS)
    user = f"u{i // per:04d}"
    return f"{user}-t{(i % per) // 20:03d}", f"m{i:07d}"


def picks(turns: int, rounds: int, offset: int) -> list[int]:
    """`rounds` user turns (i % 3 == 0) spread over the namespace."""
    step = max(3, (turns // max(1, rounds)) // 3 * 3)
    return [min(turns - 3, offset * 3 + k * step) // 3 * 3 for k in range(rounds)]


def left_on_disk(ch: Any, thread_id: str, msg_id: str) -> dict[str, int]:
    params = {"ns": MAIN_NS, "th": thread_id, "m": msg_id}
    where = "namespace = {ns:String} AND thread_id = {th:String} AND msg_id = {m:String}"
    out = {}
    for table in ("conversations", "conversation_embeddings", "conversation_vectors_384"):
        out[table] = int(
            ch.query(
                f"SELECT count() FROM {table} WHERE {where} SETTINGS apply_deleted_mask = 0",
                parameters=params,
            ).result_rows[0][0]
        )
    return out


async def run_op(client: httpx.AsyncClient, op: str, thread_id: str, msg_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {"namespace": MAIN_NS, "agent": AGENT, "thread_id": thread_id, "msg_id": msg_id}
    if op == "redact":
        body["ranges"] = [[0, 12]]
    t0 = time.perf_counter()
    r = await client.post(f"/v1/conversation.{'redact' if op == 'redact' else 'delete_message'}", json=body)
    answer = time.perf_counter() - t0
    r.raise_for_status()
    got = r.json()
    return {
        "msg_id": msg_id,
        "answer_ms": answer * 1000,
        "unreadable_ms": got["unreadable_ms"],
        "gone_ms": got["gone_ms"],
        "removal": got["removal"],
        "tables": got["tables"],
    }


async def measure(port: int, token: str, clickhouse_url: str, turns: int, rounds: int) -> dict[str, Any]:
    import clickhouse_connect

    url = urlparse(clickhouse_url)
    ch = clickhouse_connect.get_client(host=url.hostname, port=url.port, database="loom")
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        for op, offset in (("redact", 0), ("delete", 1)):
            runs = []
            for i in picks(turns, rounds, offset):
                thread_id, msg_id = key_of(i, turns)
                got = await run_op(client, op, thread_id, msg_id)
                got["left"] = left_on_disk(ch, thread_id, msg_id)
                log(
                    f"  {op} {msg_id}: unreadable {got['unreadable_ms']:.0f} ms, answer {got['answer_ms']:.0f} ms "
                    f"(removal {got['removal']}, gone {got['gone_ms']:.0f} ms; left {got['left']}; load {load_avg()})"
                )
                runs.append(got)
            out[op] = runs
    ch.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", action="store_true")
    add_settle_argument(ap)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()

    log(f"redact bench (load avg {load_avg()}, {os.cpu_count()} cores)")
    stack = LoomStack(embedder="fake", keep=args.keep)
    try:
        stack.start(log)
        bulk_load(stack.clickhouse_url, MAIN_NS, args.turns, USERS, vectors=True, seed=args.seed)
        settled_s = settle(stack.clickhouse_url, args.settle * 60) if args.settle else 0.0
        token = mint(stack)
        result = asyncio.run(measure(stack.port, token, stack.clickhouse_url, args.turns, args.rounds))
    finally:
        stack.stop()
    summary: dict[str, Any] = {"turns": args.turns, "rounds": args.rounds, "settled_s": round(settled_s)}
    for op, runs in result.items():
        unread = statistics.median(r["unreadable_ms"] for r in runs)
        summary[op] = {
            "unreadable_p50_ms": unread,
            "answer_p50_ms": statistics.median(r["answer_ms"] for r in runs),
            "gone_p50_ms": statistics.median(r["gone_ms"] for r in runs if r["removal"] == "done")
            if any(r["removal"] == "done" for r in runs)
            else None,
            "removals_pending": sum(r["removal"] != "done" for r in runs),
            "unreadable_over_target": unread / TARGET_MS,
        }
    summary["cores"] = os.cpu_count()
    summary["load_avg_end"] = load_avg()
    log(json.dumps(summary, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC):%Y-%m-%d-%H%M}-redact.json"
    path.write_text(json.dumps({"summary": summary, **result}, indent=2))
    log(f"results: {path}")


if __name__ == "__main__":
    main()
