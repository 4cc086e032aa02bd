"""Question: How long until an erased user is unreadable, and until their rows are gone from disk,
at 100k-1M turns; how fast is an export?

    python -m bench.studies.erasure [--turns 100000] [--users 100] [--erase 5] [--export-turns 100000]

Result: bench/results/<date>-<time>-erasure.{json,txt} (last: 2026-12-02-0518-erasure.json).

erasure.request and erasure.export on the whole embedded stack, through the API.

It starts Loom as ``loom serve`` does, in a temporary LOOM_HOME (bench/loom_stack.py: the
embedded ClickHouse endpoint, the embedded Redis, one arq worker, the API under uvicorn;
the fake embedder, since nothing here embeds), then bulk-loads through the store's insert
functions (so the derived tables are fed by their materialized views as in production):

* ``bench-erase``: ``--turns`` turns of ``--users`` users (threads of 20 turns, one user
  each; user and assistant turns with 384-dimension vectors, a tenth of them saved);
* ``bench-export``: one user with ``--export-turns`` turns.

Figures (the machine has 2 cores and is shared: medians, with the load average):

* erase one user (~turns/users turns) of the large namespace: the time until
  ``erasure.request`` answers (nothing of the user is readable any more) and until
  ``erasure.status`` says ``done`` (the rows are gone from disk), for ``--erase`` users
  one at a time. Targets: p50 <= 250 ms and <= 5 s.
* export: ``erasure.export`` of the ``bench-export`` user, streamed over HTTP and counted
  line by line. Target: >= 20,000 rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.loom_stack import LoomStack  # noqa: E402

MAIN_NS, EXPORT_NS = "bench-erase", "bench-export"
AGENT = "default"
LOAD_BATCH = 25_000
WORDS = [
    "ledger",
    "invoice",
    "export",
    "migration",
    "deploy",
    "staging",
    "rollback",
    "table",
    "index",
    "query",
    "vector",
    "thread",
    "agent",
    "user",
    "billing",
    "account",
    "refund",
    "report",
    "schema",
    "cluster",
    "replica",
    "shard",
    "merge",
    "part",
    "granule",
    "token",
    "session",
    "brief",
]


def log(msg: str) -> None:
    print(msg, flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))


_WORDS_SQL = "[" + ", ".join(f"'{w}'" for w in WORDS) + "]"


def bulk_load(
    clickhouse_url: str, namespace: str, turns: int, users: int, *, vectors: bool, seed: int
) -> float:
    """Generate the rows inside ClickHouse (INSERT ... SELECT FROM numbers()): the
    materialized views feed the derived tables exactly as an append's insert would (the
    transcript's postings, which Loom's writers write themselves, are backfilled after),
    and 1M turns load in minutes instead of an hour of Python row building. Thread ``i//20``
    of user ``i // per_user``; roles user/assistant/tool in turn; a tenth of the user
    turns saved; 384-dimension unit vectors for user and assistant turns."""
    import clickhouse_connect

    from loom.clock import next_version
    from loom.store import transcript_postings

    url = urlparse(clickhouse_url)
    ch = clickhouse_connect.get_client(
        host=url.hostname,
        port=url.port,
        database="loom",
        send_receive_timeout=1800,
        autogenerate_session_id=False,
    )
    per_user = max(1, turns // users)
    base = int((datetime.now(UTC) - timedelta(days=30)).timestamp())
    t0 = time.perf_counter()
    for lo in range(0, turns, LOAD_BATCH):
        n = min(turns, lo + LOAD_BATCH) - lo
        params = {
            "ns": namespace,
            "lo": lo,
            "n": n,
            "per": per_user,
            "base": base,
            "v": next_version(),
            "s": seed,
        }
        src = (
            "SELECT number, concat('u', leftPad(toString(intDiv(number, {per:UInt64})), 4, '0')) AS u, "
            "concat(u, '-t', leftPad(toString(intDiv(number % {per:UInt64}, 20)), 3, '0')) AS th, "
            "concat('m', leftPad(toString(number), 7, '0')) AS mid, "
            "['user', 'assistant', 'tool'][number % 3 + 1] AS role, "
            "toDateTime64({base:Int64} + number, 6, 'UTC') AS ts, "
            "role = 'user' AND number % 10 = 0 AS saved, "
            f"arrayStringConcat(arrayMap(i -> {_WORDS_SQL}[cityHash64({{s:UInt64}}, number, i) % {len(WORDS)} + 1], "
            "range(20 + cityHash64({s:UInt64}, number) % 61)), ' ') AS content "
            "FROM numbers({lo:UInt64}, {n:UInt64})"
        )
        ch.command(
            "INSERT INTO conversations (namespace, agent, thread_id, msg_id, ts, role, content, reasoning, "
            "user_id, run_id, metadata, tokens, high_sensitivity, is_saved, saved_at, version) "
            f"SELECT {{ns:String}}, '{AGENT}', th, mid, ts, role, content, '', u, '', '{{}}', NULL, false, saved, "
            f"if(saved, toDateTime64(ts, 3, 'UTC'), NULL), {{v:UInt64}} + number FROM ({src})",
            parameters=params,
        )
        if vectors:
            ch.command(
                "INSERT INTO conversation_embeddings (namespace, thread_id, msg_id, agent, role, run_id, user_id, "
                "ts, text, embedding, model, error, is_saved, saved_at, version) "
                f"SELECT {{ns:String}}, th, mid, '{AGENT}', role, '', u, ts, substring(content, 1, 2048), "
                "L2Normalize(arrayMap(i -> toFloat32(randNormal(0, 1, number * 384 + i)), range(384))), 'fake', '', "
                f"saved, if(saved, toDateTime64(ts, 3, 'UTC'), NULL), {{v:UInt64}} + number FROM ({src}) "
                "WHERE role != 'tool'",
                parameters=params,
                # The vector tables' HNSW indexes are left to their merges (as an append's
                # small inserts leave them): built at insert, 100k turns took 10 minutes.
                settings={"exclude_materialize_skip_indexes_on_insert": "ann"},
            )
    # The transcript's postings, as an append would have written them (the removal
    # deletes them too).
    transcript_postings.backfill(ch, namespace)
    took = time.perf_counter() - t0
    t1 = time.perf_counter()
    for table in ("conversations", "conversation_embeddings"):
        ch.command(f"OPTIMIZE TABLE {table} FINAL")
    # The vector tables' merges build their HNSW indexes in the background (at 1M turns,
    # tens of minutes on 2 cores): a removal's mutation of those tables waits for them.
    merging = ch.query(
        "SELECT count() AS n, round(max(elapsed)) AS s, round(min(progress), 2) AS p FROM system.merges "
        "WHERE database = 'loom'"
    ).result_rows[0]
    log(
        f"  {namespace}: {turns:,} turns loaded in {took:.1f}s, OPTIMIZE FINAL {time.perf_counter() - t1:.1f}s "
        f"(merges running after: {merging[0]}, oldest {merging[1]}s, least progress {merging[2]})"
    )
    ch.close()
    return took


def settle(clickhouse_url: str, limit_s: float) -> float:
    """Wait until the engine has no merge or mutation running for loom (a namespace in
    its steady state, not one still digesting its bulk load); the seconds waited."""
    import clickhouse_connect

    url = urlparse(clickhouse_url)
    ch = clickhouse_connect.get_client(host=url.hostname, port=url.port, database="loom")
    started = time.monotonic()
    quiet_since: float | None = None
    try:
        while time.monotonic() - started < limit_s:
            busy = ch.query(
                "SELECT (SELECT count() FROM system.merges WHERE database = 'loom')"
                " + (SELECT count() FROM system.mutations WHERE database = 'loom' AND NOT is_done)"
            ).result_rows[0][0]
            now = time.monotonic()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= 30:
                break
            if int(now - started) % 300 < 10:
                log(f"  settling: {busy} merges/mutations running, {now - started:.0f} s (load {load_avg()})")
            time.sleep(10)
    finally:
        ch.close()
    return time.monotonic() - started


def add_settle_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--settle",
        type=float,
        default=0,
        metavar="MINUTES",
        help="after the load, wait up to this long for its merges and mutations to finish",
    )


def mint(stack: LoomStack) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom.cli.main",
            "token",
            "mint",
            "--namespace",
            MAIN_NS,
            "--namespace",
            EXPORT_NS,
            "--role",
            "admin",
        ],
        env=stack.env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out.stdout.decode().strip().splitlines()[-1]


def gone(clickhouse_url: str, user: str) -> dict[str, int]:
    """Rows of the user still in the part files, per table (lightweight-delete masks
    ignored: a masked row is still on disk), and the inactive parts still on disk (a
    rewritten part's old files, which the engine deletes after old_parts_lifetime)."""
    from loom.store.clickhouse import connect

    ch = connect(clickhouse_url, database="loom")
    out = {}
    params = {"ns": MAIN_NS, "u": user, "p": f"{user}-"}
    for table, where in (
        ("conversations", "user_id = {u:String}"),
        ("saved_docs", "user_id = {u:String}"),
        ("saved_terms", "user_id = {u:String}"),
        ("saved_vectors", "user_id = {u:String}"),
        ("conversation_vectors_384", "startsWith(thread_id, {p:String})"),
        ("threads", "startsWith(thread_id, {p:String})"),
    ):
        out[table] = int(
            ch.query(
                f"SELECT count() FROM {table} WHERE namespace = {{ns:String}} AND {where} "
                "SETTINGS apply_deleted_mask = 0",
                parameters=params,
            ).result_rows[0][0]
        )
    out["inactive_parts"] = int(
        ch.query("SELECT count() FROM system.parts WHERE database = 'loom' AND NOT active").result_rows[0][0]
    )
    ch.close()
    return out


async def erase(client: httpx.AsyncClient, user: str, gone_timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = await client.post("/v1/erasure.request", json={"user_id": user, "namespaces": [MAIN_NS]})
    unreadable = time.perf_counter() - t0
    r.raise_for_status()
    body = r.json()
    while True:
        s = (await client.post("/v1/erasure.status", json={"erasure_id": body["erasure_id"]})).json()
        if s["state"] == "done":
            done: float | None = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > gone_timeout:  # not gone yet: said so, not waited for
            done = None
            break
        await asyncio.sleep(0.02)
    tables = body["receipt"]["tables"]
    return {
        "user": user,
        "unreadable_s": unreadable,
        "gone_s": done,
        "tombstoned": {t: v["tombstoned"] for t, v in tables.items()},
        "removed": {t: v["removed"] for t, v in s["receipt"]["tables"].items()},
    }


async def export(client: httpx.AsyncClient, user: str) -> dict[str, Any]:
    rows = 0
    nbytes = 0
    t0 = time.perf_counter()
    first = None
    async with client.stream(
        "POST", "/v1/erasure.export", json={"user_id": user, "namespaces": [EXPORT_NS]}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None:
                first = time.perf_counter() - t0
            nbytes += len(line) + 1
            if line.startswith('{"kind":"turn"'):
                rows += 1
    took = time.perf_counter() - t0
    return {"rows": rows, "seconds": took, "rows_per_s": rows / took, "first_line_s": first, "bytes": nbytes}


def _finite(value: float) -> float | None:
    """A median over erasures not all gone within --gone-timeout may be infinite: None."""
    return value if value != float("inf") else None


def _secs(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "not within --gone-timeout"


async def measure(
    port: int, token: str, users: list[str], rounds: int, gone_timeout: float
) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        erased = []
        for u in users:
            got = await erase(client, u, gone_timeout)
            log(
                f"  erase {u}: unreadable {got['unreadable_s'] * 1000:.0f} ms, gone {_secs(got['gone_s'])} "
                f"({got['tombstoned'].get('conversations')} turns; load {load_avg()})"
            )
            erased.append(got)
        exports = []
        for _ in range(rounds):
            got = await export(client, "u0000")
            log(
                f"  export: {got['rows']:,} rows in {got['seconds']:.2f} s = {got['rows_per_s']:,.0f} rows/s "
                f"(first line after {got['first_line_s'] * 1000:.0f} ms; load {load_avg()})"
            )
            exports.append(got)
    return {"erase": erased, "export": exports}


def baseline_dataset(turns: int, users: int, seed: int) -> tuple[list[dict[str, Any]], Any, Any]:
    """The same turns the Loom namespace holds (users, threads, roles, saved flags; texts
    and vectors of the same kind), for the Postgres baseline's COPY."""
    import numpy as np

    rng = random.Random(seed)
    per_user = max(1, turns // users)
    base = datetime.now(UTC) - timedelta(days=30)
    rows: list[dict[str, Any]] = []
    for i in range(turns):
        user = f"u{i // per_user:04d}"
        role = ("user", "assistant", "tool")[i % 3]
        ts = (base + timedelta(seconds=i)).isoformat()
        saved = role == "user" and i % 10 == 0
        rows.append(
            {
                "namespace": MAIN_NS,
                "thread_id": f"{user}-t{(i % per_user) // 20:03d}",
                "msg_id": f"m{i:07d}",
                "role": role,
                "user_id": user,
                "ts": ts,
                "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))),
                "saved_at": ts if saved else None,
            }
        )
    vectors = np.random.default_rng(seed).standard_normal((turns, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    has_vec = np.array([r["role"] != "tool" for r in rows])
    return rows, vectors, has_vec


async def baseline_erase(turns: int, users_total: int, users: list[str], seed: int) -> dict[str, Any]:
    """The Postgres baseline (bench/pg_baseline) with the same namespace, its indexes
    built as for search, then /v1/erasure.user for the same users, timed over HTTP."""
    from bench.pg_baseline.target import BaselineTarget
    from bench.targets import RunContext

    target = BaselineTarget()
    ctx = RunContext(quick=True, concurrency=4, seed=seed, repo=ROOT, log=log)
    try:
        await target.start(ctx)
        rows, vectors, has_vec = baseline_dataset(turns, users_total, seed)
        t0 = time.perf_counter()
        await target.bulk_load(rows, vectors, has_vec)
        try:
            built = await target.finish_load()
        except Exception:
            # The server's own words on why (a crash shows as a closed connection here).
            log(
                f"  baseline: index build failed; postgres log:\n{target.server.log_tail(40) if target.server else ''}"
            )
            raise
        log(
            f"  baseline: {turns:,} turns loaded and indexed in {time.perf_counter() - t0:.1f}s {built['seconds']}"
        )
        erased = []
        for u in users:
            t0 = time.perf_counter()
            n = await target.erase_user(MAIN_NS, u)
            took = time.perf_counter() - t0
            log(f"  baseline erase {u}: {took * 1000:.0f} ms ({n} rows; load {load_avg()})")
            erased.append({"user": u, "seconds": took, "rows": n})
        return {"erase": erased, "postgres": target.facts()}
    finally:
        await target.stop()  # also after a start that failed: it stops the server it began


PLAIN_TABLE = """
CREATE TABLE turns (
    namespace text NOT NULL, thread_id text NOT NULL, msg_id text NOT NULL, role text NOT NULL,
    user_id text, ts timestamptz NOT NULL, content text NOT NULL, embedding bytea, saved_at timestamptz,
    tsv tsvector GENERATED ALWAYS AS
        (CASE WHEN saved_at IS NOT NULL THEN to_tsvector('english', content) END) STORED
)
"""


def plain_baseline_erase(
    turns: int, users_total: int, users: list[str], seed: int, why: str
) -> dict[str, Any]:
    """The baseline's table and DELETE without pgvector, when its pgvector cannot run
    here: the system PostgreSQL, the vector kept as 1,536 bytes (the same row width),
    every index but the HNSW one (pgvector leaves a DELETE's index work to VACUUM, so the
    DELETE itself costs the same). Timed as the baseline's /v1/erasure.user runs it."""
    import psycopg

    from bench.pg_baseline import sql
    from bench.pg_baseline.postgres import PgInstall, PostgresServer, _system_bindirs, server_settings
    from bench.pg_baseline.target import _mem_bytes

    bindirs = _system_bindirs()
    if not bindirs:
        raise RuntimeError("no system PostgreSQL for the plain baseline")
    server = PostgresServer(
        PgInstall(bindirs[0], "system"), settings=server_settings(_mem_bytes(), os.cpu_count() or 2), log=log
    )
    server.start()
    try:
        rows, vectors, _ = baseline_dataset(turns, users_total, seed)
        t0 = time.perf_counter()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(PLAIN_TABLE)
            cols = "namespace, thread_id, msg_id, role, user_id, ts, content, embedding, saved_at"
            with conn.cursor() as cur, cur.copy(f"COPY turns ({cols}) FROM STDIN") as cp:
                for i, r in enumerate(rows):
                    cp.write_row(
                        (
                            r["namespace"],
                            r["thread_id"],
                            r["msg_id"],
                            r["role"],
                            r["user_id"],
                            r["ts"],
                            r["content"],
                            vectors[i].tobytes() if r["role"] != "tool" else None,
                            r["saved_at"],
                        )
                    )
            for stmt in sql.CREATE_INDEXES:
                if "hnsw" not in stmt:
                    conn.execute(stmt)
            conn.execute("VACUUM (ANALYZE) turns")
            version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            log(
                f"  baseline (plain PostgreSQL {version}): {turns:,} turns loaded and indexed in "
                f"{time.perf_counter() - t0:.1f}s"
            )
            erased = []
            for u in users:
                t0 = time.perf_counter()
                n = conn.execute(sql.ERASE_USER, (MAIN_NS, u)).rowcount
                took = time.perf_counter() - t0
                log(f"  baseline erase {u}: {took * 1000:.0f} ms ({n} rows; load {load_avg()})")
                erased.append({"user": u, "seconds": took, "rows": n})
        return {"erase": erased, "postgres": {"version": version, "mode": "plain", "why": why}}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--erase", type=int, default=5)
    ap.add_argument("--export-turns", type=int, default=100_000)
    ap.add_argument("--export-rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--gone-timeout",
        type=float,
        default=600.0,
        help="stop polling erasure.status after this many seconds (the figure is then reported as not reached)",
    )
    add_settle_argument(ap)
    ap.add_argument("--no-baseline", action="store_true", help="skip the Postgres baseline")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()

    log(f"erasure bench (load avg {load_avg()}, {os.cpu_count()} cores)")
    stack = LoomStack(embedder="fake", keep=args.keep)
    try:
        stack.start(log)
        bulk_load(stack.clickhouse_url, MAIN_NS, args.turns, args.users, vectors=True, seed=args.seed)
        bulk_load(stack.clickhouse_url, EXPORT_NS, args.export_turns, 1, vectors=False, seed=args.seed + 1)
        if args.settle:
            log(f"  settled after {settle(stack.clickhouse_url, args.settle * 60):.0f} s")
        token = mint(stack)
        step = max(1, args.users // args.erase)
        users = [f"u{i:04d}" for i in range(1, args.users, step)][: args.erase]
        result = asyncio.run(measure(stack.port, token, users, args.export_rounds, args.gone_timeout))
        result["left_on_disk"] = {u: gone(stack.clickhouse_url, u) for u in users}
    finally:
        stack.stop()
    if not args.no_baseline:
        # After Loom's stack is gone: the two never share the machine while measured.
        try:
            result["baseline"] = asyncio.run(baseline_erase(args.turns, args.users, users, args.seed))
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            log(f"  baseline with pgvector failed ({why.splitlines()[0]}); the plain baseline instead")
            try:
                result["baseline"] = plain_baseline_erase(args.turns, args.users, users, args.seed, why)
            except Exception as plain_exc:  # Loom's figures are still written
                log(f"  plain baseline failed too: {type(plain_exc).__name__}: {plain_exc}")
    unread = [e["unreadable_s"] for e in result["erase"]]
    done = [e["gone_s"] if e["gone_s"] is not None else float("inf") for e in result["erase"]]
    rates = [e["rows_per_s"] for e in result["export"]]
    base = [e["seconds"] for e in result.get("baseline", {}).get("erase", [])]
    ratios = {}
    if base:
        ratios = {
            "baseline_erase_p50_ms": statistics.median(base) * 1000,
            "unreadable_over_baseline": statistics.median(unread) / statistics.median(base),
            "gone_over_baseline": _finite(statistics.median(done) / statistics.median(base)),
        }
    summary = {
        "turns": args.turns,
        "users": args.users,
        "turns_per_user": args.turns // args.users,
        "erase_unreadable_p50_ms": statistics.median(unread) * 1000,
        "erase_gone_p50_s": _finite(statistics.median(done)),
        "export_rows": args.export_turns,
        "export_rows_per_s_median": statistics.median(rates),
        **ratios,
        "cores": os.cpu_count(),
        "load_avg_end": load_avg(),
    }
    log(json.dumps(summary, indent=2))
    log(f"left on disk after done: {json.dumps(result['left_on_disk'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC):%Y-%m-%d-%H%M}-erasure.json"
    path.write_text(json.dumps({"summary": summary, **result}, indent=2))
    log(f"results: {path}")


if __name__ == "__main__":
    main()
