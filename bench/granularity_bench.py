"""What the index granularity of loom.conversations and loom.conversation_embeddings
costs and saves (issue 25): the engine's CPU and wall time per statement of the hot
point reads, the scans, an append flush's insert, and the primary index's memory, at
several granularities side by side.

In this process, on clickhouse-connect's chdb backend (the store code runs unchanged;
no HTTP): per shape ("one": every turn in one namespace; "spread": 200 namespaces) one
database per granularity, each migrated up to the newest migration before 020 and then
given the granularity by migration 020's own statements (the table rebuilt as a copy),
then filled with the same bench/datagen.py turns and random 384-d vectors. The vector
tables' views are dropped first (their HNSW builds are not what is compared here; the
vector leg's own statement reads conversation_vectors_384, whose granules are 64 rows
whatever this migration does). Every statement runs on the same keys in each
database, the databases taken in turn per call, so they share the machine's load.
CPU is this process's CPU time over the call (the engine runs in it): its background
merges count too, so the tables are merged (OPTIMIZE FINAL) and the merges waited for.

    .venv/bin/python bench/granularity_bench.py [--turns 100000] [--calls 30] [--grans 8192,1024,256]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import datagen  # noqa: E402
from clickhouse_schema import runner  # noqa: E402
from loom.clock import next_version  # noqa: E402
from loom.store import conversations as conv_store  # noqa: E402
from loom.store import embeddings as emb_store  # noqa: E402
from loom.store import saved as saved_store  # noqa: E402
from loom.store import search as search_store  # noqa: E402

REBUILD = 20  # the migration that sets the granularity
TABLES = ("conversations", "conversation_embeddings")
FLUSH = 32


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def client(path: Path, database: str) -> Any:
    import clickhouse_connect

    from loom.embedded.clickhouse_endpoint import engine_server_settings

    return clickhouse_connect.get_client(
        interface="chdb", path=str(path), database=database, chdb_options=engine_server_settings()
    )


def rebuild_statements(granularity: int) -> list[str]:
    """Migration 020's statements with another granularity in place of its own."""
    migration = next(m for m in runner.discover() if m.number == REBUILD)
    sql = migration.path.read_text()
    own = int(sql.split("index_granularity = ")[1].split()[0].rstrip(",;"))
    sql = sql.replace(f"index_granularity = {own}", f"index_granularity = {granularity}")
    return runner.split_statements(runner.fill_run(runner.render(sql)))


def migrate(ch: Any, granularity: int) -> None:
    for m in runner.discover():
        if m.number < REBUILD:
            for st in m.statements():
                ch.command(st)
    views = ch.query(
        "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine = 'MaterializedView' "
        "AND create_table_query LIKE '%TO %conversation_vectors_%'"
    ).result_rows
    for (name,) in views:
        ch.command(f"DROP VIEW {name}")
    if granularity != 8192:
        for st in rebuild_statements(granularity):
            ch.command(st)


def turn_rows(raw: list[dict[str, Any]]) -> list[conv_store.Turn]:
    return [
        conv_store.Turn(
            namespace=t["namespace"],
            agent="default",
            thread_id=t["thread_id"],
            msg_id=t["msg_id"],
            ts=datetime.fromisoformat(t["ts"].replace("Z", "+00:00")),
            role=t["role"],
            content=t["content"],
            user_id=t["user_id"],
            version=next_version(),
        )
        for t in raw
    ]


def emb_rows(turns: list[conv_store.Turn], rng: np.random.Generator) -> list[emb_store.EmbeddingRow]:
    vecs = rng.standard_normal((len(turns), 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [
        emb_store.EmbeddingRow(
            namespace=t.namespace,
            thread_id=t.thread_id,
            msg_id=t.msg_id,
            agent=t.agent,
            role=t.role,
            run_id="",
            user_id=t.user_id,
            ts=t.ts,
            text=t.content[:2048],
            embedding=v,
            model="fake-384",
            version=t.version,
        )
        for t, v in zip(turns, vecs, strict=True)
    ]


def shape_turns(shape: str, n: int) -> list[conv_store.Turn]:
    if shape == "one":
        return turn_rows(datagen.turns(n, 7, "g-one"))
    per = n // 200
    out: list[conv_store.Turn] = []
    for i in range(200):
        out += turn_rows(datagen.turns(per, 7 + i, f"g-sp{i:03d}"))
    return out


def fill(dbs: dict[int, Any], turns: list[conv_store.Turn], layout: str) -> None:
    """The same rows into every database. "merged": loaded once, copied by the engine,
    then merged into one part per table; "natural": every database takes the same
    2,000-row inserts and merges them as it would (several parts, as a store in use)."""
    first_g, first = next(iter(dbs.items()))
    rng = np.random.default_rng(7)
    size = 10_000 if layout == "merged" else 2_000
    for i in range(0, len(turns), size):
        batch = turns[i : i + size]
        embs = emb_rows(batch, rng)
        for g, ch in dbs.items():
            if layout == "natural" or g == first_g:
                conv_store.TABLE.insert(ch, batch)
                emb_store.TABLE.insert(ch, embs)
    if layout == "natural":
        return
    src = first.database
    for g, ch in dbs.items():
        if g != first_g:
            for table in TABLES:
                ch.command(f"INSERT INTO {table} SELECT * FROM {src}.{table}")
    for ch in dbs.values():
        for table in TABLES:
            ch.command(f"OPTIMIZE TABLE {table} FINAL")


def settle(ch: Any) -> None:
    for _ in range(600):
        if not ch.command("SELECT count() FROM system.merges"):
            return
        time.sleep(0.5)


def index_facts(ch: Any) -> dict[str, dict[str, int]]:
    rows = ch.query(
        "SELECT table, count() AS parts, sum(rows) AS rows, sum(marks) AS marks, "
        "sum(primary_key_bytes_in_memory) AS pk_mem, sum(primary_key_bytes_in_memory_allocated) AS pk_alloc, "
        "sum(marks_bytes) AS marks_bytes, sum(bytes_on_disk) AS disk "
        "FROM system.parts WHERE database = currentDatabase() AND active AND table IN {t:Array(String)} GROUP BY table",
        parameters={"t": list(TABLES)},
    ).named_results()
    return {r.pop("table"): {k: int(v) for k, v in r.items()} for r in rows}


class Timer:
    def __init__(self) -> None:
        self.cpu: dict[tuple[str, int], list[float]] = {}
        self.wall: dict[tuple[str, int], list[float]] = {}

    def run(self, name: str, g: int, fn: Callable[[Any], Any], ch: Any) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        fn(ch)
        self.cpu.setdefault((name, g), []).append((time.process_time() - c0) * 1000)
        self.wall.setdefault((name, g), []).append((time.perf_counter() - t0) * 1000)

    def table(self, grans: list[int]) -> list[str]:
        names = list(dict.fromkeys(n for n, _ in self.cpu))
        head = f"  {'statement':34}" + "".join(
            f"{f'CPU@{g}':>10}{f'p50@{g}':>10}{f'p95@{g}':>10}" for g in grans
        )
        out = [head + f"{'CPU ratio':>12}"]
        for n in names:
            line = f"  {n:34}"
            cpus = []
            for g in grans:
                c, w = self.cpu.get((n, g), [0.0]), sorted(self.wall.get((n, g), [0.0]))
                cpus.append(statistics.median(c))
                line += f"{cpus[-1]:10.2f}{statistics.median(w):10.2f}{w[int(0.95 * (len(w) - 1))]:10.2f}"
            ratios = "/".join(f"{x / cpus[0]:.2f}" for x in cpus[1:]) if cpus[0] else "-"
            out.append(line + f"{ratios:>12}")
        return out


Statement = tuple[str, Callable[[Any], Any]]


def read_statements(
    key: conv_store.TurnKey,
    flush: list[conv_store.TurnKey],
    few: list[conv_store.Turn],
    thread: list[conv_store.Turn],
    scan: bool,
) -> list[Statement]:
    """The hot reads of one sample, each a function of the database's client."""
    emb_key = (key[0], key[2], key[3])
    few3 = [(x.namespace, x.thread_id, x.msg_id) for x in few]
    ns, th = thread[0].namespace, thread[0].thread_id
    out: list[Statement] = [
        ("transcript_row (FINAL, key)", lambda ch: saved_store.transcript_row(ch, key)),
        ("copies (FINAL, no agent)", lambda ch: saved_store.copies(ch, *emb_key)),
        ("emb get (FINAL, key, vector)", lambda ch: emb_store.get(ch, *emb_key)),
        ("emb states (FINAL, 1 key)", lambda ch: emb_store.states(ch, [emb_key])),
        ("landed (32 keys, no FINAL)", lambda ch: conv_store.landed(ch, flush)),
        ("turn states (32 keys, no FINAL)", lambda ch: conv_store.states(ch, flush)),
        ("verify_embeddings (13 keys)", lambda ch: search_store.verify_embeddings(ch, few3)),
        ("verify_turns (13 keys)", lambda ch: search_store.verify_turns(ch, few3, ["default"])),
        ("thread read (page of 50, FINAL)", lambda ch: conv_store.page(ch, ns, "default", th, limit=50)),
    ]
    if scan:  # a scan of the namespace's text (FINAL): what small granules may cost
        out.append(
            (
                "substring scan (namespace, FINAL)",
                lambda ch: search_store.substring(
                    ch, [key[0]], "zq-not-there", search_store.Filters(), fetch=10, chars=200
                ),
            )
        )
    return out


def rotated(grans: list[int], i: int) -> list[int]:
    """Each call starts with another database: none always runs first (or last)."""
    return grans[i % len(grans) :] + grans[: i % len(grans)]


def measure(shape: str, dbs: dict[int, Any], turns: list[conv_store.Turn], calls: int, timer: Timer) -> None:
    rng = random.Random(11)
    threads: dict[tuple[str, str], list[conv_store.Turn]] = {}
    for t in turns:
        threads.setdefault((t.namespace, t.thread_id), []).append(t)
    long_threads = [v for v in threads.values() if len(v) >= 20]
    for i in range(calls):
        t = rng.choice(turns)
        thread = rng.choice(long_threads)
        # an append's duplicate check: the flush's 32 keys of one thread, half new
        head = thread[0]
        flush = [x.key for x in thread[:16]] + [
            (head.namespace, "default", head.thread_id, f"new-{i}-{j}") for j in range(16)
        ]
        statements = read_statements(t.key, flush, rng.sample(turns, 13), thread, scan=i % 3 == 0)
        for g in rotated(list(dbs), i):
            for name, fn in statements:
                timer.run(name, g, fn, dbs[g])
    log(f"  {shape}: reads done, load {load_avg()}")


def write_statements(batch: list[conv_store.Turn], embs: list[emb_store.EmbeddingRow]) -> list[Statement]:
    key = batch[0].key
    return [
        ("INSERT 32 turns (append flush)", lambda ch: conv_store.insert(ch, batch)),
        ("INSERT 32 embedding rows", lambda ch: emb_store.insert(ch, embs)),
        (
            "claim (INSERT..SELECT FINAL)",
            lambda ch: saved_store.claim(ch, key, "u-claim", datetime.now(UTC), next_version()),
        ),
    ]


def measure_writes(shape: str, dbs: dict[int, Any], calls: int, timer: Timer) -> None:
    """A 32-turn append flush (the transcript insert with its postings and views) and an
    embedding row insert of 32, then a claim (save_message's INSERT ... SELECT FINAL)."""
    ns = "g-one" if shape == "one" else "g-sp000"
    fresh = turn_rows(datagen.fresh_turns(FLUSH * calls, 5, f"w{shape}"))
    for t in fresh:
        t.namespace = ns
    rng = np.random.default_rng(3)
    for i in range(calls):
        batch = fresh[i * FLUSH : (i + 1) * FLUSH]
        statements = write_statements(batch, emb_rows(batch, rng))
        for g in rotated(list(dbs), i):
            for name, fn in statements:
                timer.run(name, g, fn, dbs[g])
    log(f"  {shape}: writes done, load {load_avg()}")


def time_migration(ch: Any, granularity: int) -> str:
    """Migration 020 applied to a filled database (the one left at 8,192): its wall and
    CPU time, and every stored row still there."""
    counts = "SELECT (SELECT count() FROM conversations), (SELECT count() FROM conversation_embeddings)"
    before = ch.query(counts).result_rows[0]
    c0, t0 = time.process_time(), time.perf_counter()
    for st in rebuild_statements(granularity):
        ch.command(st)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = ch.query(counts).result_rows[0]
    return (
        f"migration 020 (to {granularity}) on the filled 8192 database: {wall:.1f} s wall, {cpu:.1f} s CPU; "
        f"rows (conversations, embeddings) before {tuple(before)}, after {tuple(after)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--grans", default="8192,1024,256")
    ap.add_argument("--shapes", default="one,spread")
    ap.add_argument("--layout", choices=("merged", "natural"), default="merged")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    grans = [int(x) for x in args.grans.split(",")]
    home = Path(tempfile.mkdtemp(prefix="loom-gran-", dir="/tmp"))
    lines = [
        f"granularity bench, {args.turns} turns per shape, layout {args.layout}, {args.calls} calls per statement, "
        f"started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {load_avg()}",
    ]
    try:
        base = client(home / "ch", "default")
        for shape in args.shapes.split(","):
            dbs: dict[int, Any] = {}
            for g in grans:
                name = f"g{g}_{shape}"
                base.command(f"CREATE DATABASE IF NOT EXISTS {name}")
                dbs[g] = client(home / "ch", name)
                migrate(dbs[g], g)
            turns = shape_turns(shape, args.turns)
            log(f"{shape}: filling {len(turns)} turns")
            fill(dbs, turns, args.layout)
            settle(base)
            for g, ch in dbs.items():
                lines.append(f"{shape} g={g}: {index_facts(ch)}")
            timer = Timer()
            lines.append(f"{shape}: reads start, load {load_avg()}")
            measure(shape, dbs, turns, args.calls, timer)
            lines.append(f"{shape}: reads end, load {load_avg()}")
            measure_writes(shape, dbs, max(10, args.calls // 2), timer)
            lines.append(f"{shape}: writes end, load {load_avg()}")
            lines.append(
                f"{shape}: CPU ms (median) / wall p50, p95 ms per call; CPU ratio = each granularity / {grans[0]}"
            )
            lines += timer.table(grans)
            if 8192 in dbs:
                lines.append(time_migration(dbs[8192], min(grans)))
            for line in lines[-(len(timer.cpu) // len(grans) + 3) :]:
                print(line, flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
