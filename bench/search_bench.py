"""conversation.search on the whole embedded stack: latency and recall at 10k, 100k and 1M turns.

Run: ``.venv/bin/python bench/search_bench.py [--scales 10k,100k,1m] [--queries 200] [--keep]``

It starts the stack as ``loom serve`` does (bench/append_bench.py's Stack: embedded
ClickHouse endpoint, embedded Redis, one worker, the API with the real MiniLM embedder)
in a temporary LOOM_HOME, then for each scale, growing one dataset (bench/datagen.py:
the 10k set is a prefix of the 100k one):

1. bulk-loads the new turns of ``bench-main`` (and N/20 in each of two other namespaces)
   through loom.store.conversations.insert and loom.store.embeddings.insert in large
   batches; the vector tables fill themselves from the embedding inserts (migration
   002), building an HNSW graph per inserted part. Vectors: real MiniLM vectors for a
   pool of texts (cached in bench/.cache), the rest derived from them (datagen.derive);
2. times ``OPTIMIZE TABLE conversation_vectors_384 FINAL`` (one part, one graph);
3. times conversation.search over HTTP from one client (text queries, so the API embeds
   each with MiniLM: the query embedding is included), p50/p95/p99, and recall@10
   against exact cosine search (with the 0.30 floor) over the namespace's vectors, and
   the CPU time the stack's processes spent per search (other work on a shared machine
   inflates wall-clock latency far more than it inflates this);
4. times the two ranking strategies of loom/store/search.py directly (no HTTP, no
   embedding) on namespaces and threads of several sizes: where the exact scan stops
   paying.

Targets (embedded mode, query embedding included): p95 <= 25 ms at 100,000 turns in the
namespace, <= 50 ms at 1,000,000. The 1-minute load average is printed beside every
figure: other work on the machine skews them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import datagen  # noqa: E402
from bench.append_bench import Conn, Stack, free_port  # noqa: E402
from bench.stats import percentiles, recall_at_k  # noqa: E402

MAIN = datagen.MAIN_NS
NOISE = datagen.NOISE_NS
TABLE = "conversation_vectors_384"
MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
SCALES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}


def load_avg() -> str:
    return "load avg " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the data ---------------------------------------------------------------------------


@dataclass
class Data:
    """Every turn of the largest scale, its vector (zeros when not embedded) and whether it
    gets an embedding row (user/assistant turns that do not read as high)."""

    turns: dict[str, list[datagen.Turn]]
    vectors: dict[str, np.ndarray]
    embedded: dict[str, np.ndarray]
    queries: list[str]
    query_vectors: np.ndarray


def build_data(scale: int, n_queries: int, n_real: int, seed: int, log: Callable[[str], None]) -> Data:
    from loom.sensitivity import reads_as_high

    t0 = time.perf_counter()
    turns = {MAIN: datagen.turns(scale, seed, MAIN)}
    for ns in NOISE:
        turns[ns] = datagen.turns(max(1, scale // 20), seed, ns)
    log(f"  generated {sum(len(v) for v in turns.values()):,} turns in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    # As the write path does: a user/assistant turn that reads as high gets no embedding row.
    flat = [
        (ns, i)
        for ns, ts in turns.items()
        for i, t in enumerate(ts)
        if datagen.embeddable(t) and not reads_as_high(t["content"])
    ]
    log(f"  screened for sensitivity in {time.perf_counter() - t0:.1f}s ({len(flat):,} embeddable)")
    texts = [datagen.embed_text(turns[ns][i]) for ns, i in flat]
    real = [p for p, (ns, _) in enumerate(flat) if ns == MAIN][:n_real]
    vecs, real_mask = datagen.vectors_for(texts, real=real, seed=seed, log=log)
    vectors = {ns: np.zeros((len(ts), datagen.DIM), dtype=np.float32) for ns, ts in turns.items()}
    embedded = {ns: np.zeros(len(ts), dtype=bool) for ns, ts in turns.items()}
    for p, (ns, i) in enumerate(flat):
        vectors[ns][i] = vecs[p]
        embedded[ns][i] = True
    source = [turns[ns][i] for p, (ns, i) in enumerate(flat) if real_mask[p]]
    queries = [q["text"] for q in datagen.search_queries(source, n_queries, seed)]
    qv = datagen.default_embedder().embed(queries)
    return Data(turns, vectors, embedded, queries, np.asarray(qv, dtype=np.float32))


def _ts(t: datagen.Turn) -> datetime:
    return datetime.fromisoformat(str(t["ts"]).replace("Z", "+00:00")).astimezone(UTC)


def load(ch: Any, data: Data, ns: str, lo: int, hi: int, batch: int, log: Callable[[str], None]) -> float:
    """Insert turns [lo, hi) of `ns` (transcript rows and embedding rows) in batches."""
    from loom.clock import next_version
    from loom.store import conversations as conv_store
    from loom.store import embeddings as emb_store

    spent = 0.0
    for start in range(lo, hi, batch):
        end = min(hi, start + batch)
        rows: list[conv_store.Turn] = []
        embs: list[emb_store.EmbeddingRow] = []
        for i in range(start, end):
            t = data.turns[ns][i]
            ts, version = _ts(t), next_version()
            high = datagen.embeddable(t) and not data.embedded[ns][i]  # screened out in build_data
            rows.append(
                conv_store.Turn(
                    namespace=ns,
                    agent="default",
                    thread_id=t["thread_id"],
                    msg_id=t["msg_id"],
                    ts=ts,
                    role=t["role"],
                    content=t["content"],
                    user_id=t["user_id"],
                    high_sensitivity=bool(high),
                    version=version,
                )
            )
            if data.embedded[ns][i]:
                embs.append(
                    emb_store.EmbeddingRow(
                        namespace=ns,
                        thread_id=t["thread_id"],
                        msg_id=t["msg_id"],
                        agent="default",
                        role=t["role"],
                        run_id="",
                        user_id=t["user_id"],
                        ts=ts,
                        text=datagen.embed_text(t),
                        embedding=data.vectors[ns][i],
                        model=MODEL_ID,
                        version=version,
                    )
                )
        t0 = time.perf_counter()
        conv_store.insert(ch, rows)
        emb_store.insert(ch, embs)
        took = time.perf_counter() - t0
        spent += took
        log(f"    {ns}: {end:,}/{hi:,} ({len(embs):,} vectors) in {took:.1f}s  [{load_avg()}]")
    return spent


# -- measurements -----------------------------------------------------------------------


@dataclass
class ScaleResult:
    scale: int
    load_seconds: float
    optimize_seconds: float
    parts_before_optimize: int
    latency_ms: dict[str, float]
    recall_at_10: float
    empty: int
    plans: dict[str, int]
    load_before: str
    load_after: str
    cpu_ms_per_search: float  # CPU the stack (API + endpoint + worker) spent per search
    strategies: list[dict[str, Any]] = field(default_factory=list)
    breakdown: dict[str, Any] = field(default_factory=dict)


async def measure(
    port: int, token: str, warm: Sequence[str], queries: Sequence[str]
) -> tuple[list[float], list[list[str]]]:
    """Each query once, one at a time (after the `warm` ones, not counted)."""
    conn = Conn("127.0.0.1", port, token)
    lat: list[float] = []
    hits: list[list[str]] = []
    loop = asyncio.get_running_loop()
    for i, q in enumerate([*warm, *queries]):
        t0 = loop.time()
        status, body = await conn.post(
            "/v1/conversation.search", {"namespace_scope": "one", "namespace": MAIN, "query": q, "limit": 10}
        )
        took = loop.time() - t0
        if status != 200:
            raise RuntimeError(f"search failed: {status} {body}")
        if body["mode"] != "vector":
            raise RuntimeError(f"search fell back to substring: {body['fallback_reason']}")
        if i >= len(warm):
            lat.append(took)
            hits.append([h["msg_id"] for h in body["hits"]])
    await conn.close()
    return lat, hits


def plan_counts(port: int, token: str, queries: Sequence[str]) -> Counter[str]:
    import httpx

    out: Counter[str] = Counter()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as c:
        for q in queries:
            r = c.post(
                "/v1/conversation.search", json={"namespace_scope": "one", "namespace": MAIN, "query": q}
            )
            out[r.headers.get("x-loom-search-plan", "?")] += 1
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of the processes (clock ticks from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def truth(data: Data, scale: int) -> list[list[str]]:
    n = min(scale, len(data.turns[MAIN]))
    mask = data.embedded[MAIN][:n]
    ids = [t["msg_id"] for t, m in zip(data.turns[MAIN][:n], mask, strict=True) if m]
    return datagen.exact_topk(data.vectors[MAIN][:n][mask], ids, data.query_vectors, k=10)


def strategies(ch: Any, data: Data, scale: int, n: int = 30) -> list[dict[str, Any]]:
    """The two ways of loom/store/search.py, timed directly on several sizes."""
    from loom.store import search as store

    cases: list[tuple[str, str, store.Filters, int]] = [
        (f"{MAIN} ({scale:,})", MAIN, store.Filters(), scale),
        (f"{NOISE[0]} ({max(1, scale // 20):,})", NOISE[0], store.Filters(), max(1, scale // 20)),
        (f"{MAIN}, one thread", MAIN, store.Filters(thread_id=data.turns[MAIN][0]["thread_id"]), 0),
        (f"{MAIN}, role=user", MAIN, store.Filters(role="user"), 0),
    ]
    per_ns, total = store.counts(ch, TABLE, [MAIN, *NOISE], store.Filters(), MODEL_ID)
    out = []
    for name, ns, filters, _ in cases:
        counted, _t = store.counts(ch, TABLE, [ns], filters, MODEL_ID)
        rows = counted.get(ns, 0)
        share = rows / max(1, total)
        row: dict[str, Any] = {"case": name, "rows": rows}
        for way in ("exact", "index"):
            lat = []
            for q in data.query_vectors[:n]:
                t0 = time.perf_counter()
                if way == "exact":
                    store.exact(ch, TABLE, [ns], q, filters, 30, MODEL_ID)
                else:
                    store.nearest(ch, TABLE, [ns], q, filters, 30, 1.5 / max(share, 1e-6), MODEL_ID)
                lat.append(time.perf_counter() - t0)
            row[way] = percentiles(lat[3:])
        out.append(row)
    return out


def breakdown(ch: Any, data: Data, scale: int, n: int = 40) -> dict[str, Any]:
    """Where one search of bench-main spends its time, step by step, outside the API."""
    from loom.settings import Settings
    from loom.store import search as store

    plan_rows = store.counts(ch, TABLE, [MAIN], store.Filters(), MODEL_ID)[0].get(MAIN, 0)
    by_index = plan_rows > Settings().conversation_search_exact_max_rows
    steps: dict[str, list[float]] = {"counts": [], "candidates": [], "verify": []}
    for q in data.query_vectors[:n]:
        t0 = time.perf_counter()
        per_ns, total = store.counts(ch, TABLE, [MAIN], store.Filters(), MODEL_ID)
        t1 = time.perf_counter()
        if by_index:
            cands = store.nearest(
                ch, TABLE, [MAIN], q, store.Filters(), 30, 1.5 * total / max(1, per_ns[MAIN]), MODEL_ID
            )
        else:
            cands = store.exact(ch, TABLE, [MAIN], q, store.Filters(), 30, MODEL_ID)
        t2 = time.perf_counter()
        keys = [c.key for c in cands if c.similarity >= 0.3][:13]  # the limit + VERIFY_SPARE first verified
        store.verify_embeddings(ch, keys)
        store.verify_turns(ch, keys, {c.agent for c in cands})
        t3 = time.perf_counter()
        steps["counts"].append(t1 - t0)
        steps["candidates"].append(t2 - t1)
        steps["verify"].append(t3 - t2)
    return {k: percentiles(v[3:]) for k, v in steps.items()}


def parts(ch: Any) -> int:
    return int(
        ch.query(
            "SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = {t:String} "
            "AND active",
            parameters={"t": TABLE},
        ).result_rows[0][0]
    )


def merges(ch: Any) -> int:
    return int(
        ch.query(
            "SELECT count() FROM system.merges WHERE database = currentDatabase() AND table = {t:String}",
            parameters={"t": TABLE},
        ).result_rows[0][0]
    )


def optimize(ch: Any) -> float:
    """Merge the vector table into one part (one HNSW graph). OPTIMIZE FINAL leaves out parts
    a background merge holds, so wait for those and ask again."""
    t0 = time.perf_counter()
    while True:
        ch.command(f"OPTIMIZE TABLE {TABLE} FINAL")
        if parts(ch) <= 1:
            return time.perf_counter() - t0
        while merges(ch):
            time.sleep(1.0)


def client(url: str) -> Any:
    """A client of the endpoint that waits as long as a 1M-row index build takes."""
    from urllib.parse import urlparse

    import clickhouse_connect

    u = urlparse(url)
    return clickhouse_connect.get_client(
        host=u.hostname,
        port=u.port,
        database="loom",
        compress="lz4",
        send_receive_timeout=7200,
        autogenerate_session_id=False,
    )


# -- main -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--scales", default="10k,100k,1m", help="comma-separated: 10k, 100k, 1m")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=50_000, help="rows per bulk insert")
    ap.add_argument("--real-vectors", type=int, default=2_000, help="texts embedded with the real model")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-optimize", action="store_true", help="measure with the parts as loaded")
    ap.add_argument("--keep", action="store_true", help="keep the temporary LOOM_HOME")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    scales = sorted(SCALES[s.strip().lower()] for s in args.scales.split(","))

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"start [{load_avg()}], {os.cpu_count()} CPUs")
    data = build_data(scales[-1], args.queries + args.warmup, args.real_vectors, args.seed, log)
    home = Path(tempfile.mkdtemp(prefix="loomsb-", dir="/tmp"))
    stack = Stack(home, free_port(), "minilm")
    results: list[ScaleResult] = []
    try:
        stack.start(log)
        from loom.auth.tokens import mint
        from loom.embedded.clickhouse_endpoint import find_running_endpoint

        url = find_running_endpoint(home / "clickhouse")
        assert url, "the embedded endpoint is not running"
        ch = client(url)
        token = mint(ch, [MAIN, *NOISE], "viewer", "all", "", "").token
        done = {ns: 0 for ns in data.turns}
        for scale in scales:
            log(f"\n== {scale:,} turns in {MAIN} [{load_avg()}]")
            before = load_avg()
            spent = 0.0
            for ns in data.turns:
                target = scale if ns == MAIN else max(1, scale // 20)
                spent += load(ch, data, ns, done[ns], target, args.batch, log)
                done[ns] = target
            n_parts = parts(ch)
            took = 0.0
            if not args.no_optimize:
                took = optimize(ch)
                log(
                    f"  OPTIMIZE FINAL of {TABLE}: {took:.1f}s ({n_parts} parts -> {parts(ch)})  [{load_avg()}]"
                )
            queries = data.queries[args.warmup :]
            pids = descendants(stack.proc.pid) if stack.proc else []
            asyncio.run(measure(stack.port, token, [], data.queries[: args.warmup]))
            cpu0 = cpu_seconds(pids)
            lat, hits = asyncio.run(measure(stack.port, token, [], queries))
            cpu = (cpu_seconds(pids) - cpu0) / max(1, len(queries))
            plans = plan_counts(stack.port, token, queries[:20])
            expected = truth(data, scale)[args.warmup :]
            res = ScaleResult(
                scale,
                spent,
                took,
                n_parts,
                percentiles(lat),
                recall_at_k(hits, expected),
                sum(1 for h in hits if not h),
                dict(plans),
                before,
                load_avg(),
                cpu * 1000,
            )
            res.strategies = strategies(ch, data, scale)
            res.breakdown = breakdown(ch, data, scale)
            results.append(res)
            show(res, log)
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    log("\n== conversation.search, one client over HTTP, MiniLM query embedding included ==")
    for res in results:
        show(res, log, brief=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC):%Y-%m-%d-%H%M}-search.json"
    path.write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
    log(f"results: {path}")


def show(res: ScaleResult, log: Callable[[str], None], brief: bool = False) -> None:
    lat = res.latency_ms
    target = "<= 25 ms" if res.scale <= 100_000 else "<= 50 ms"
    log(
        f"{res.scale:>9,} turns: p50 {lat['p50']:6.1f} ms  p95 {lat['p95']:6.1f} ms  p99 {lat['p99']:6.1f} ms  "
        f"(target p95 {target})  CPU/search {res.cpu_ms_per_search:.1f} ms  recall@10 {res.recall_at_10:.3f}  empty {res.empty}  plan {res.plans}  "
        f"load {res.load_seconds:.0f}s + optimize {res.optimize_seconds:.0f}s  [{res.load_before} -> {res.load_after}]"
    )
    if brief:
        return
    log(
        "    steps of one search (no HTTP, no embedding): "
        + ", ".join(f"{k} p50 {v['p50']:.1f} / p95 {v['p95']:.1f} ms" for k, v in res.breakdown.items())
    )
    for row in res.strategies:
        e, i = row["exact"], row["index"]
        log(
            f"    {row['case']:<28} {row['rows']:>9,} rows: exact p50 {e['p50']:6.1f} / p95 {e['p95']:6.1f} ms   "
            f"index p50 {i['p50']:6.1f} / p95 {i['p95']:6.1f} ms"
        )


if __name__ == "__main__":
    main()
