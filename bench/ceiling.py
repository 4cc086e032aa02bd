"""Ceiling study (issue 25): where each op's time and CPU go, link by link, beside the
Postgres + pgvector baseline.

    .venv/bin/python -m bench.ceiling [--scale 10k] [--calls 40] [--save-seconds 20] [--out bench/results]

For each op (conversation.append of N turns, conversation.search vector at 1 client,
conversation.save_message, conversation.search_saved_messages hybrid) it measures, one call
at a time:

  a  the ClickHouse statements alone, on chdb in this process (no HTTP): the engine's floor;
  a' the ops in this process on clickhouse-connect's chdb backend (no endpoint, same store code);
  b  the same statements through the embedded HTTP endpoint (raw keep-alive HTTP, no client library);
  c  the ops layer called in this process (loom.ops, clickhouse-connect to the endpoint, no FastAPI);
  d  the full op over HTTP through Loom's API (``loom serve``, as the harness runs it);
  e  the baseline's op over HTTP (same client) and its SQL alone (psycopg, in this process).

The statements of a and b are the ones c sent, recorded at clickhouse-connect's urllib3 pool
(URL, headers, body) and replayed. Every link gives p50/p95 and CPU per op (process CPU time
deltas of every process involved; chdb has no system.query_log, so the engine's CPU is link a's
in-process delta). Then ``save_message`` from 8 clients over HTTP (p50, saves/s) and its
per-step breakdown at c. Order: Loom (d, c, b, save load), Loom stopped, the baseline loaded,
then a and e back to back.
"""

from __future__ import annotations

import os
import time

os.environ["TZ"] = "UTC"  # link a runs chdb in this process, as the endpoint runs it (UTC)
time.tzset()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from collections.abc import Awaitable, Callable, Iterator, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import parse_qsl, urlsplit  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from bench import datagen  # noqa: E402
from bench.stats import percentiles, recall_at_k  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCALES = {"10k": 10_000, "100k": 100_000}
K = 10
APPEND_SIZES = (1, 32)
SAVE_PATH = "/v1/conversation.save_message"


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {msg}", flush=True)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --------------------------------------------------------------------------------------
# CPU accounting: process CPU time deltas of named processes
# --------------------------------------------------------------------------------------


class Cpu:
    """CPU seconds of a set of named processes (children included where asked), read before
    and after a loop of calls."""

    def __init__(self, procs: dict[str, list[int]]):
        self.procs = procs

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pids in self.procs.items():
            total = 0.0
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    t = psutil.Process(pid).cpu_times()
                    total += t.user + t.system
            out[name] = total
        return out


def role_of(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for needle, role in (
        ("clickhouse_endpoint", "endpoint"),
        ("redis-server", "redis"),
        ("loom.api.process", "api"),
        ("uvicorn", "api"),
        ("workers.process", "worker"),
    ):
        if needle in text:
            return role
    return "serve"


def stack_processes(root: int) -> dict[str, list[int]]:
    from bench.loom_stack import descendants

    out: dict[str, list[int]] = {}
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(psutil.Error):
            out.setdefault(role_of(psutil.Process(pid).cmdline()), []).append(pid)
    return out


@dataclass
class Link:
    """One link's figures for one op: wall time per call and CPU per call by process."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def summary(self) -> dict[str, Any]:
        p = percentiles(self.wall)
        return {
            "n": p.get("n", 0),
            "p50_ms": round(p.get("p50", float("nan")), 2),
            "p95_ms": round(p.get("p95", float("nan")), 2),
            "cpu_ms_per_op": {k: round(v * 1000, 2) for k, v in self.cpu.items()},
            "cpu_ms_total": round(sum(self.cpu.values()) * 1000, 2),
            "note": self.note,
        }


def timed(name: str, calls: Sequence[Callable[[], Any]], cpu: Cpu, note: str = "") -> Link:
    link = Link(name, note=note)
    before = cpu.read()
    try:
        for call in calls:
            t0 = time.perf_counter()
            call()
            link.wall.append(time.perf_counter() - t0)
    except Exception as exc:  # a failing link is reported, the study goes on
        link.note = f"failed after {len(link.wall)} calls: {type(exc).__name__}: {exc}"[:400]
        log(f"    {name}: {link.note}")
    after = cpu.read()
    link.cpu = {k: (after[k] - before[k]) / max(1, len(link.wall)) for k in after}
    return link


async def timed_async(
    name: str, calls: Sequence[Callable[[], Awaitable[Any]]], cpu: Cpu, note: str = ""
) -> Link:
    link = Link(name, note=note)
    before = cpu.read()
    try:
        for call in calls:
            t0 = time.perf_counter()
            await call()
            link.wall.append(time.perf_counter() - t0)
    except Exception as exc:  # a failing link is reported, the study goes on
        link.note = f"failed after {len(link.wall)} calls: {type(exc).__name__}: {exc}"[:400]
        log(f"    {name}: {link.note}")
    after = cpu.read()
    link.cpu = {k: (after[k] - before[k]) / max(1, len(link.wall)) for k in after}
    return link


# --------------------------------------------------------------------------------------
# Recording the HTTP requests clickhouse-connect sends (link c), replaying them (a, b)
# --------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One request clickhouse-connect sent: enough to send it again, byte for byte."""

    method: str
    target: str  # path + query string
    headers: dict[str, str]
    body: bytes
    seconds: float
    label: str


_LABEL_RE = re.compile(r"\b(INSERT\s+INTO|FROM)\s+`?([A-Za-z_][\w.]*)`?", re.I)


def label_of(sql: str) -> str:
    words = sql.strip().split(None, 1)
    first = words[0].upper() if words else "?"
    m = _LABEL_RE.search(sql)
    return f"{first} {m.group(2)}" if m else first


class Recorder:
    """Wraps the shared urllib3 pool's request(): while `on`, every request is kept (a body
    that is a generator is read into bytes first, a multipart form encoded, so it can be
    sent again unchanged)."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.original = pool.request
        self.on = False
        self.sent: list[Sent] = []
        self.lock = threading.Lock()
        pool.request = self._request

    def _request(self, method: str, url: str, **kw: Any) -> Any:
        if not self.on:
            return self.original(method, url, **kw)
        import urllib3

        headers = dict(kw.pop("headers", None) or {})
        fields = kw.pop("fields", None)
        body = kw.pop("body", None)
        if fields:
            body, ctype = urllib3.encode_multipart_formdata(fields)
            headers["Content-Type"] = ctype
        elif body is not None and not isinstance(body, bytes | bytearray | str):
            body = b"".join(bytes(c) for c in body)
        if isinstance(body, str):
            body = body.encode()
        split = urlsplit(url)
        params = dict(parse_qsl(split.query, keep_blank_values=True))
        sql = params.get("query") or (body or b"")[:400].decode("utf-8", "replace")
        if fields:
            q = dict(fields).get("query", "")
            sql = str(q[1] if isinstance(q, tuple) else q)
        t0 = time.perf_counter()
        resp = self.original(method, url, headers=headers, body=body, **kw)
        took = time.perf_counter() - t0
        target = split.path + ("?" + split.query if split.query else "")
        with self.lock:
            self.sent.append(Sent(method, target, headers, bytes(body or b""), took, label_of(sql)))
        return resp

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Sent]]:
        self.sent = []
        self.on = True
        try:
            yield self.sent
        finally:
            self.on = False


def http_replay(host: str, port: int) -> Callable[[list[Sent]], None]:
    """Send recorded requests again on one keep-alive connection; read every reply."""
    conn = http.client.HTTPConnection(host, port)

    def run(calls: list[Sent]) -> None:
        for s in calls:
            headers = {k: v for k, v in s.headers.items() if k.lower() != "transfer-encoding"}
            conn.request(s.method, s.target, body=s.body or None, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status >= 400:
                raise RuntimeError(f"replay of {s.label}: HTTP {r.status}")

    return run


@dataclass
class Direct:
    """A recorded request as chdb takes it: URL parameters and the decoded body."""

    params: dict[str, str]
    body: bytes
    label: str


def to_direct(s: Sent) -> Direct:
    from loom.embedded import clickhouse_endpoint as ep

    params = dict(parse_qsl(urlsplit(s.target).query, keep_blank_values=True))
    body = s.body
    ctype = next((v for k, v in s.headers.items() if k.lower() == "content-type"), "")
    if ctype.lower().startswith("multipart/form-data"):
        for name, _filename, value in ep._parse_multipart(body, ctype):
            params[name] = value.decode()
        body = b""
    enc = next((v for k, v in s.headers.items() if k.lower() == "content-encoding"), "").strip().lower()
    if body and enc and enc != "identity":
        body = b"".join(ep._decode_body(iter([body]), enc))
    if params.get("decompress") in ("1", "true"):
        body = b"".join(ep._decode_native_blocks(iter([body])))
    return Direct(params, body, s.label)


def direct_runner(engine: Any, per_statement: dict[str, list[float]]) -> Callable[[list[Direct]], None]:
    """Run decoded requests on the endpoint's own engine class, in this process (the
    endpoint's statement handling without its HTTP layer); each statement's wall time
    and process CPU time go to `per_statement[label]`."""
    from loom.embedded import clickhouse_endpoint as ep

    def run(calls: list[Direct]) -> None:
        for d in calls:
            req = ep._request_from_params(dict(d.params), iter([d.body]) if d.body else iter(()))
            t0, c0 = time.perf_counter(), time.process_time()
            with engine.pooled_handle() as handle:
                reply = ep._execute(handle, None, req)
                bytes(reply.body)
            acc = per_statement.setdefault(d.label, [0.0, 0.0, 0.0])
            acc[0] += time.perf_counter() - t0
            acc[1] += time.process_time() - c0
            acc[2] += 1

    return run


# --------------------------------------------------------------------------------------
# The data
# --------------------------------------------------------------------------------------


@dataclass
class Data:
    ds: datagen.Dataset
    queries: list[str]
    qvecs: np.ndarray
    truth: list[list[str]]
    calib_vecs: np.ndarray
    calib_truth: list[list[str]]
    saved_queries: list[str]
    save_pool: list[datagen.Turn]  # embedded main turns, none saved yet: one save each


def build_data(scale: int, calls: int, save_pool: int) -> Data:
    ds = datagen.build_dataset(scale, n_real=2_000, n_search=calls, n_calibration=60, n_saved=calls, log=log)
    main = np.flatnonzero(ds.has_vec & ds.rows_of(datagen.MAIN_NS))
    ids = [ds.turns[i]["msg_id"] for i in main]
    qtexts = [q["text"] for q in ds.search]
    ctexts = [q["text"] for q in ds.calibration]
    qv = datagen.embed_real(qtexts + ctexts, log=log)
    truth = datagen.exact_topk(ds.vectors[main], ids, qv[: len(qtexts)])
    calib = datagen.exact_topk(ds.vectors[main], ids, qv[len(qtexts) :])
    pool = [ds.turns[i] for i in main if not ds.turns[i].get("saved_at")][-save_pool:]
    return Data(
        ds=ds,
        queries=qtexts,
        qvecs=qv[: len(qtexts)],
        truth=truth,
        calib_vecs=qv[len(qtexts) :],
        calib_truth=calib,
        saved_queries=[q["text"] for q in ds.saved],
        save_pool=pool,
    )


def fresh_tool_turns(n: int, tag: str) -> list[datagen.Turn]:
    return datagen.fresh_turns(n, 7, tag, roles=("tool",))


# --------------------------------------------------------------------------------------
# Loom: links d, c, b (and the recorded statements for a)
# --------------------------------------------------------------------------------------

OPS = ("append1", "append32", "search", "save_message", "saved_search")


@dataclass
class LoomRun:
    links: dict[str, dict[str, Link]] = field(default_factory=dict)  # op -> link -> figures
    recorded: dict[str, list[list[Sent]]] = field(default_factory=dict)  # op -> per call
    steps: dict[str, Any] = field(default_factory=dict)
    save_load: dict[str, Any] = field(default_factory=dict)
    recall: float = 0.0
    embed_ms: dict[str, float] = field(default_factory=dict)
    home: Path | None = None
    data_dir: Path | None = None
    database: str = "loom"
    facts: dict[str, Any] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)
    idle_a: dict[str, float] = field(default_factory=dict)
    procs: dict[str, list[int]] = field(default_factory=dict)


def _add(run: LoomRun, op: str, link: Link) -> None:
    run.links.setdefault(op, {})[link.name] = link
    s = link.summary()
    log(
        f"    {op:<13} {link.name:<28} p50 {s['p50_ms']:8.2f} ms  p95 {s['p95_ms']:8.2f} ms  cpu {s['cpu_ms_total']:7.2f} ms/op  (load {load_avg()})"
    )


async def run_loom(data: Data, calls: int, save_clients: int, save_seconds: float) -> LoomRun:
    from bench.loom_target import APPEND_PATH, LoomTarget
    from bench.targets import RunContext
    from loom.auth.principal import Principal, Role
    from loom.embedded.backends import clickhouse_dir
    from loom.ops.conversation.reading import searching
    from loom.ops.conversation.saved import saved_reads, saving
    from loom.ops.conversation.writing import appending
    from loom.services import open_services
    from loom.settings import Settings
    from loom.store import clickhouse as ch_module

    out = LoomRun()
    target = LoomTarget()
    ctx = RunContext(quick=True, concurrency=save_clients + 2, seed=42, repo=REPO, keep=True, log=log)
    await target.start(ctx)
    assert target.stack is not None
    out.home = target.stack.home
    out.data_dir = clickhouse_dir(Settings(home=target.stack.home))
    try:
        # No reset(): the stack is new and empty (reset's settle() waits for an arq queue
        # that the worker's scheduled jobs keep non-empty).
        await target.bulk_load(data.ds.turns, data.ds.vectors, data.ds.has_vec)
        notes = await target.finish_load()
        log(f"  loom: loaded and merged ({notes.get('seconds')})")
        target._wake()
        out.facts = target.facts()
        root = target.stack.proc.pid if target.stack.proc else os.getpid()
        procs = stack_processes(root)
        procs["bench"] = [os.getpid()]
        cpu = Cpu(procs)
        out.procs = procs
        before = cpu.read()
        await asyncio.sleep(3.0)
        after = cpu.read()
        out.idle = {k: round((after[k] - before[k]) * 1000 / 3.0, 1) for k in after}
        log(f"  loom processes: {procs}; idle CPU ms/s: {out.idle}")
        ns = datagen.MAIN_NS
        pool = list(data.save_pool)

        # -- d: the full op over HTTP through the API --------------------------------------
        log("  link d (API over HTTP)")
        for q in data.queries[:3]:
            await target.search(ns, q, K)  # warm: model, caches
        hits: list[list[str]] = []

        async def search_d(q: str) -> None:
            hits.append(await target.search(ns, q, K))

        _add(
            out,
            "search",
            await timed_async("d: API over HTTP", [lambda q=q: search_d(q) for q in data.queries], cpu),
        )
        out.recall = recall_at_k(hits, data.truth[: len(hits)])
        log(
            f"    recall@10 {out.recall:.3f}; first query {data.queries[0]!r}: hits {hits[0][:3]} truth {data.truth[0][:3]}"
        )
        sq = data.saved_queries
        _add(
            out,
            "saved_search",
            await timed_async(
                "d: API over HTTP",
                [lambda q=q: target.saved_search(datagen.SAVED_NS, datagen.SAVER, q, K) for q in sq],
                cpu,
            ),
        )
        for size in APPEND_SIZES:
            batches = [fresh_tool_turns(size, f"d{size}-{i}") for i in range(calls)]

            def body(b: list[datagen.Turn]) -> dict[str, Any]:
                return {
                    "namespace": ns,
                    "agent": "default",
                    "turns": [
                        {
                            "thread_id": t["thread_id"],
                            "msg_id": t["msg_id"],
                            "role": "tool",
                            "content": t["content"],
                        }
                        for t in b
                    ],
                }

            _add(
                out,
                f"append{size}",
                await timed_async(
                    "d: API over HTTP", [lambda b=b: target.post(APPEND_PATH, body(b)) for b in batches], cpu
                ),
            )

        def save_body(t: datagen.Turn) -> dict[str, Any]:
            return {
                "namespace": t["namespace"],
                "user_id": t["user_id"],
                "conversation_id": t["thread_id"],
                "message_id": t["msg_id"],
            }

        d_saves = [pool.pop() for _ in range(calls)]
        _add(
            out,
            "save_message",
            await timed_async(
                "d: API over HTTP", [lambda t=t: target.post(SAVE_PATH, save_body(t)) for t in d_saves], cpu
            ),
        )

        # -- c: the ops in this process (recorded: the statements of a and b) --------------
        log("  link c (ops in this process, clickhouse-connect to the endpoint)")
        tmp_home = Path(tempfile.mkdtemp(prefix="loom-ceiling-"))
        settings = Settings(
            home=tmp_home,
            clickhouse_url=target.clickhouse_url,
            redis_url=target.redis_url,
            embedder="minilm",
            clickhouse_database=target.database,
        )
        out.database = target.database
        svc = await open_services(settings, settings.clickhouse_url, settings.redis_url)
        recorder = Recorder(ch_module._shared_pool())
        who = Principal("ceiling", tuple(datagen_namespaces()), Role.admin)
        steps = Steps(svc)
        try:
            await searching.search(svc, who, data.queries[0], namespace_scope="one", namespace=ns, limit=K)

            async def rec(op: str, fn: Callable[[], Awaitable[Any]]) -> None:
                with recorder.recording() as sent, steps.on(op):
                    await fn()
                out.recorded.setdefault(op, []).append(list(sent))

            ops_c: dict[str, list[Callable[[], Awaitable[Any]]]] = {
                "search": [
                    lambda q=q: rec(
                        "search",
                        lambda: searching.search(svc, who, q, namespace_scope="one", namespace=ns, limit=K),
                    )
                    for q in data.queries
                ],
                "saved_search": [
                    lambda q=q: rec(
                        "saved_search",
                        lambda: saved_reads.search_saved_messages(
                            svc, who, datagen.SAVED_NS, datagen.SAVER, q, limit=K, search_mode="hybrid"
                        ),
                    )
                    for q in sq
                ],
            }
            for size in APPEND_SIZES:
                batches = [fresh_tool_turns(size, f"c{size}-{i}") for i in range(calls)]
                ops_c[f"append{size}"] = [
                    lambda b=b, size=size: rec(
                        f"append{size}",
                        lambda: appending.append(
                            svc,
                            who,
                            ns,
                            "default",
                            [
                                appending.TurnInput(t["thread_id"], "tool", t["content"], msg_id=t["msg_id"])
                                for t in b
                            ],
                        ),
                    )
                    for b in batches
                ]
            c_saves = [pool.pop() for _ in range(calls)]
            ops_c["save_message"] = [
                lambda t=t: rec(
                    "save_message",
                    lambda: saving.save_message(
                        svc, who, t["namespace"], t["user_id"], t["thread_id"], t["msg_id"]
                    ),
                )
                for t in c_saves
            ]
            for op in OPS:
                _add(out, op, await timed_async("c: ops in-process", ops_c[op], cpu))
            out.steps = steps.report()
            out.embed_ms = await embed_cost(svc, data.queries)
        finally:
            await appending.close_pipeline(svc)
            await svc.close()
            shutil.rmtree(tmp_home, ignore_errors=True)

        # -- b: the recorded statements again, through the endpoint ------------------------
        log("  link b (the recorded statements, raw HTTP to the endpoint)")
        u = urlsplit(target.clickhouse_url)
        replay = http_replay(u.hostname or "127.0.0.1", u.port or 8123)
        for op in ("search", "saved_search", "save_message", "append1", "append32"):
            _add(
                out,
                op,
                timed(
                    "b: statements via endpoint",
                    [lambda r=r: replay(r) for r in out.recorded.get(op, [])],
                    cpu,
                ),
            )

        # -- save_message from N clients over HTTP ----------------------------------------
        try:
            out.save_load = await save_load(target, pool, save_clients, save_seconds, cpu, save_body)
        except Exception as exc:
            out.save_load = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    finally:
        await target.stop()  # keep=True: the data directory stays for link a
    return out


def datagen_namespaces() -> list[str]:
    return [datagen.MAIN_NS, *datagen.NOISE_NS, datagen.SAVED_NS]


async def embed_cost(svc: Any, texts: Sequence[str]) -> dict[str, float]:
    """The query embedding alone (MiniLM in this process): part of c and d, of no link a/b."""
    from loom.ops.embedding import inline

    walls = []
    for q in texts[:20]:
        t0 = time.perf_counter()
        await inline.embed(svc, [q])
        walls.append(time.perf_counter() - t0)
    p = percentiles(walls)
    return {"p50_ms": round(p["p50"], 2), "p95_ms": round(p["p95"], 2)}


class Steps:
    """Per-step wall time of the ops in link c: each ClickHouse request (by statement), the
    embedder, Redis commands; the rest is Python in the op."""

    def __init__(self, svc: Any):
        from loom.ops.embedding import inline

        self.svc = svc
        self.op: str | None = None
        self.totals: dict[str, dict[str, list[float]]] = {}
        self.count: dict[str, int] = {}
        self.walls: dict[str, list[float]] = {}
        self._embed = inline.embed
        self._redis = svc.redis.execute_command
        steps = self

        async def embed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await steps._embed(*a, **kw)
            finally:
                steps.add("embed (MiniLM)", time.perf_counter() - t0)

        async def redis_cmd(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await steps._redis(*a, **kw)
            finally:
                steps.add(f"redis {a[0] if a else '?'}", time.perf_counter() - t0)

        inline.embed = embed  # type: ignore[assignment]
        svc.redis.execute_command = redis_cmd
        self.current: dict[str, float] = {}

    def add(self, step: str, seconds: float) -> None:
        if self.op is not None:
            self.current[step] = self.current.get(step, 0.0) + seconds

    @contextlib.contextmanager
    def on(self, op: str) -> Iterator[None]:
        self.op, self.current = op, {}
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.walls.setdefault(op, []).append(time.perf_counter() - t0)
            per = self.totals.setdefault(op, {})
            for k, v in self.current.items():
                per.setdefault(k, []).append(v)
            self.count[op] = self.count.get(op, 0) + 1
            self.op = None

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for op, per in self.totals.items():
            n = self.count[op]
            out[op] = {
                "calls": n,
                "wall_mean_ms": round(1000 * float(np.mean(self.walls[op])), 2),
                "steps_mean_ms": {
                    k: round(1000 * sum(v) / n, 2) for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))
                },
            }
        return out


def statement_label(s: Sent) -> str:
    """The statement's first word and table, read from the decoded request (an insert's
    statement travels in its compressed body)."""
    try:
        d = to_direct(s)
    except Exception:
        return s.label
    sql = d.params.get("query") or d.body[:400].decode("utf-8", "replace")
    return label_of(sql)


def add_statement_steps(run: LoomRun) -> None:
    """Each recorded ClickHouse request's wall time (as the op saw it), by statement."""
    for op, per_call in run.recorded.items():
        by: dict[str, float] = {}
        counts: dict[str, int] = {}
        for sent in per_call:
            for s in sent:
                label = statement_label(s)
                by[label] = by.get(label, 0.0) + s.seconds
                counts[label] = counts.get(label, 0) + 1
        n = max(1, len(per_call))
        run.steps.setdefault(op, {})["clickhouse_requests_per_op"] = round(sum(counts.values()) / n, 2)
        run.steps[op]["clickhouse_mean_ms_by_statement"] = {
            f"{k} (x{counts[k] / n:.2f})": round(1000 * v / n, 2)
            for k, v in sorted(by.items(), key=lambda kv: -kv[1])
        }


async def save_load(
    target: Any,
    pool: list[datagen.Turn],
    clients: int,
    seconds: float,
    cpu: Cpu,
    body: Callable[[datagen.Turn], dict[str, Any]],
) -> dict[str, Any]:
    log(f"  save_message from {clients} clients over HTTP for {seconds:.0f} s")
    walls: list[float] = []
    retries = 0
    deadline = time.monotonic() + seconds
    # One turn per thread first: saves of one thread wait on its lease (a 503 after a
    # while), which measures the lease, not the save.
    by_thread: dict[str, datagen.Turn] = {}
    for t in pool:
        by_thread.setdefault(t["thread_id"], t)
    todo = list(by_thread.values())

    async def client() -> None:
        nonlocal retries
        while time.monotonic() < deadline and todo:
            t = todo.pop()
            t0 = time.perf_counter()
            for _ in range(5):
                try:
                    await target.post(SAVE_PATH, body(t))
                    break
                except RuntimeError as exc:
                    if "HTTP 503" not in str(exc):
                        raise
                    retries += 1  # as a client would: the same save again
            walls.append(time.perf_counter() - t0)

    before = cpu.read()
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - t0
    after = cpu.read()
    p = percentiles(walls)
    res = {
        "clients": clients,
        "saves": len(walls),
        "threads_available": len(by_thread),
        "retries_after_503": retries,
        "seconds": round(took, 2),
        "saves_per_s": round(len(walls) / took, 2),
        "p50_ms": round(p.get("p50", float("nan")), 2),
        "p95_ms": round(p.get("p95", float("nan")), 2),
        "cpu_ms_per_save": {k: round(1000 * (after[k] - before[k]) / max(1, len(walls)), 2) for k in after},
        "cpu_cores_busy": round(sum(after[k] - before[k] for k in after) / took, 2),
        "load_avg": load_avg(),
        "target": "p50 <= 60 ms and >= 50 saves/s",
    }
    log(f"    {res}")
    return res


# --------------------------------------------------------------------------------------
# Link a: the statements on chdb in this process; a': the ops on clickhouse-connect's chdb backend
# --------------------------------------------------------------------------------------


def run_direct(run: LoomRun) -> dict[str, Any]:
    from loom.embedded import clickhouse_endpoint as ep

    assert run.data_dir is not None
    engine = ep._Engine(run.data_dir)
    cpu = Cpu({"bench (chdb in-process)": [os.getpid()]})
    try:
        per: dict[str, list[float]] = {}
        go = direct_runner(engine, per)
        decoded = {op: [[to_direct(s) for s in sent] for sent in calls] for op, calls in run.recorded.items()}
        for calls in decoded.values():
            for call in calls:
                for d in call:
                    d.label = label_of(d.params.get("query") or d.body[:400].decode("utf-8", "replace"))
        for op in ("search", "saved_search"):
            for call in decoded.get(op, [])[:3]:
                go(call)  # warm: the vector indexes into their cache
        # The engine's own background work (merges, parts loading after the restart) runs
        # in this process too: its rate, to subtract from link a's CPU.
        before = cpu.read()
        time.sleep(3.0)
        after = cpu.read()
        run.idle_a = {k: round((after[k] - before[k]) * 1000 / 3.0, 1) for k in after}
        log(f"    idle CPU of the in-process engine, ms/s: {run.idle_a}")
        for op in ("search", "saved_search", "save_message", "append1", "append32"):
            per.clear()
            todo = decoded.get(op, [])
            _add(run, op, timed("a: statements on chdb", [lambda d=d: go(d) for d in todo], cpu))
            n = max(1, len(todo))
            run.steps.setdefault(op, {})["engine_in_process_by_statement"] = {
                f"{k} (x{v[2] / n:.2f})": {
                    "wall_ms": round(1000 * v[0] / n, 2),
                    "cpu_ms": round(1000 * v[1] / n, 2),
                }
                for k, v in sorted(per.items(), key=lambda kv: -kv[1][1])
            }
    finally:
        engine.close()
    return {}


async def run_chdb_client(run: LoomRun, data: Data) -> dict[str, Any]:
    """a': the same ops, in this process, on clickhouse-connect's chdb backend instead of HTTP
    (one storage code path: loom.store takes a clickhouse-connect Client either way). Redis
    is a fresh private one (leases and marks start empty)."""
    import clickhouse_connect

    from loom.auth.principal import Principal, Role
    from loom.embedded.clickhouse_endpoint import engine_server_settings
    from loom.embedded.redis_server import start_redis
    from loom.ops.conversation.reading import searching
    from loom.ops.conversation.saved import saved_reads, saving
    from loom.ops.conversation.writing import appending
    from loom.services import Services, llm_from_settings, redis_settings
    from loom.settings import Settings

    assert run.data_dir is not None
    home = Path(tempfile.mkdtemp(prefix="loom-ceiling-chdb-"))
    redis_proc = start_redis(home / "redis")
    notes: dict[str, Any] = {}
    try:
        ch = clickhouse_connect.get_client(
            interface="chdb",
            path=str(run.data_dir),
            database=run.database,
            chdb_options=engine_server_settings(),
        )
    except Exception as exc:  # an older clickhouse-connect: no chdb backend
        redis_proc.stop()
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}
    from arq.connections import create_pool
    from redis.asyncio import Redis

    settings = Settings(
        home=home, redis_url=redis_proc.url, embedder="minilm", clickhouse_database=run.database
    )
    svc = Services(
        settings,
        ch,
        Redis.from_url(redis_proc.url),
        await create_pool(redis_settings(redis_proc.url)),
        llm_from_settings(settings),
    )
    who = Principal("ceiling", tuple(datagen_namespaces()), Role.admin)
    cpu = Cpu({"bench (ops + chdb in-process)": [os.getpid()], "redis": [redis_proc.pid]})
    ns = datagen.MAIN_NS
    name = "a': ops on chdb backend"
    try:
        await searching.search(svc, who, data.queries[0], namespace_scope="one", namespace=ns, limit=K)
        await saved_reads.search_saved_messages(
            svc, who, datagen.SAVED_NS, datagen.SAVER, data.saved_queries[0], limit=K
        )
        _add(
            run,
            "search",
            await timed_async(
                name,
                [
                    lambda q=q: searching.search(svc, who, q, namespace_scope="one", namespace=ns, limit=K)
                    for q in data.queries
                ],
                cpu,
            ),
        )
        _add(
            run,
            "saved_search",
            await timed_async(
                name,
                [
                    lambda q=q: saved_reads.search_saved_messages(
                        svc, who, datagen.SAVED_NS, datagen.SAVER, q, limit=K, search_mode="hybrid"
                    )
                    for q in data.saved_queries
                ],
                cpu,
            ),
        )
        pool = list(data.save_pool)[: len(data.queries)]
        _add(
            run,
            "save_message",
            await timed_async(
                name,
                [
                    lambda t=t: saving.save_message(
                        svc, who, t["namespace"], t["user_id"], t["thread_id"], t["msg_id"]
                    )
                    for t in pool
                ],
                cpu,
            ),
        )
        for size in APPEND_SIZES:
            batches = [fresh_tool_turns(size, f"a{size}-{i}") for i in range(len(data.queries))]
            _add(
                run,
                f"append{size}",
                await timed_async(
                    name,
                    [
                        lambda b=b: appending.append(
                            svc,
                            who,
                            ns,
                            "default",
                            [
                                appending.TurnInput(t["thread_id"], "tool", t["content"], msg_id=t["msg_id"])
                                for t in b
                            ],
                        )
                        for b in batches
                    ],
                    cpu,
                ),
            )
    except Exception as exc:
        notes["error"] = f"{type(exc).__name__}: {exc}"[:600]
        log(f"    a' failed: {notes['error']}")
    finally:
        with contextlib.suppress(Exception):
            await appending.close_pipeline(svc)
        with contextlib.suppress(Exception):
            await svc.close()
        redis_proc.stop()
        shutil.rmtree(home, ignore_errors=True)
    return notes


# --------------------------------------------------------------------------------------
# Link e: the baseline over HTTP and its SQL alone
# --------------------------------------------------------------------------------------


async def start_baseline(data: Data, recall: float, pg: str = "auto") -> Any:
    from bench.pg_baseline.target import BaselineTarget
    from bench.targets import RunContext

    t = BaselineTarget()
    await t.start(RunContext(quick=True, concurrency=8, seed=42, repo=REPO, pg_source=pg, log=log))
    await t.reset()
    await t.bulk_load(data.ds.turns, data.ds.vectors, data.ds.has_vec)
    await t.finish_load()
    notes = await t.prepare_search(
        datagen.MAIN_NS, data.calib_vecs, data.calib_truth, max(0.5, recall - 0.005)
    )
    log(
        f"  baseline ready: ef_search {notes['ef_search']} (recall {notes['calibration_recall']}, Loom {recall:.3f})"
    )
    return t


def pg_processes(t: Any) -> dict[str, list[int]]:
    from bench.loom_stack import descendants

    pg = [t.server.proc.pid, *descendants(t.server.proc.pid)] if t.server and t.server.proc else []
    return {"postgres": pg, "app": [t.app.pid] if t.app else [], "bench": [os.getpid()]}


async def run_baseline(t: Any, data: Data, calls: int, run: LoomRun) -> None:
    import psycopg

    from bench.pg_baseline import sql
    from bench.pg_baseline.target import MIN_SIMILARITY

    cpu = Cpu(pg_processes(t))
    ns = datagen.MAIN_NS
    name = "e: baseline API over HTTP"
    log("  link e (baseline over HTTP, then its SQL alone)")
    for q in data.queries[:3]:
        await t.search(ns, q, K)
    _add(run, "search", await timed_async(name, [lambda q=q: t.search(ns, q, K) for q in data.queries], cpu))
    _add(
        run,
        "saved_search",
        await timed_async(
            name,
            [lambda q=q: t.saved_search(datagen.SAVED_NS, datagen.SAVER, q, K) for q in data.saved_queries],
            cpu,
        ),
    )
    for size in APPEND_SIZES:
        batches = [fresh_tool_turns(size, f"e{size}-{i}") for i in range(calls)]

        async def one_batch(b: list[datagen.Turn]) -> None:
            for turn in b:  # the baseline's API takes one turn per request
                await t.append(turn, embed=False)

        _add(
            run,
            f"append{size}",
            await timed_async(
                name, [lambda b=b: one_batch(b) for b in batches], cpu, note="one request per turn"
            ),
        )

    # SQL alone: psycopg in this process, the app's statements and settings.
    emb = datagen.embed_real(data.saved_queries, log=log)
    with psycopg.connect(t._dsn(), autocommit=True) as conn:
        sql.register_vector(conn)
        cpu = Cpu(pg_processes(t))  # again: this connection's backend is a new process
        conn.execute(f"SET hnsw.ef_search = {int(t.tuning['ef_search'])}")
        if t.iterative_scan:
            conn.execute(f"SET hnsw.iterative_scan = {t.iterative_scan}")
        name = "e: baseline SQL alone"

        def search_sql(q: np.ndarray) -> None:
            conn.execute(sql.SEARCH, {"q": q, "ns": ns, "k": K, "max_d": 1 - MIN_SIMILARITY}).fetchall()

        def saved_sql(q: np.ndarray, text: str) -> None:
            conn.execute(
                sql.SAVED_SEARCH,
                {
                    "q": q,
                    "ns": datagen.SAVED_NS,
                    "u": datagen.SAVER,
                    "text": text,
                    "n": max(50, K * 5),
                    "k": K,
                },
            ).fetchall()

        search_sql(data.qvecs[0])
        _add(
            run,
            "search",
            timed(
                name,
                [lambda q=q: search_sql(q) for q in data.qvecs],
                cpu,
                note="query vector given (no embedding)",
            ),
        )
        _add(
            run,
            "saved_search",
            timed(
                name,
                [lambda q=q, s=s: saved_sql(q, s) for q, s in zip(emb, data.saved_queries, strict=True)],
                cpu,
                note="query vector given (no embedding)",
            ),
        )
        for size in APPEND_SIZES:
            batches = [fresh_tool_turns(size, f"s{size}-{i}") for i in range(calls)]

            def insert(b: list[datagen.Turn]) -> None:
                rows = [
                    {
                        "namespace": ns,
                        "thread_id": x["thread_id"],
                        "msg_id": x["msg_id"],
                        "role": "tool",
                        "user_id": "",
                        "ts": None,
                        "content": x["content"],
                        "embedding": None,
                    }
                    for x in b
                ]
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(sql.APPEND, rows)

            _add(
                run,
                f"append{size}",
                timed(
                    name,
                    [lambda b=b: insert(b) for b in batches],
                    cpu,
                    note="one transaction (one fsync) per call",
                ),
            )


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

LINK_ORDER = (
    "a: statements on chdb",
    "a': ops on chdb backend",
    "b: statements via endpoint",
    "c: ops in-process",
    "d: API over HTTP",
    "e: baseline SQL alone",
    "e: baseline API over HTTP",
)
OP_TITLES = {
    "append1": "conversation.append, 1 tool turn per call (no embedding)",
    "append32": "conversation.append, 32 tool turns per call (one flush; baseline: 32 requests / one 32-row transaction)",
    "search": "conversation.search, vector, 1 client (Loom c/d and baseline API embed the query text)",
    "save_message": "conversation.save_message of an embedded turn (no embedding needed; baseline has no such op)",
    "saved_search": "conversation.search_saved_messages, hybrid, 1 client",
}


def table(run: LoomRun) -> tuple[list[str], dict[str, Any]]:
    lines: list[str] = []
    js: dict[str, Any] = {}
    for op in OPS:
        links = run.links.get(op, {})
        if not links:
            continue
        base = links.get("e: baseline API over HTTP")
        base_sql = links.get("e: baseline SQL alone")
        bp95 = percentiles(base.wall)["p95"] if base and base.wall else None
        bsql95 = percentiles(base_sql.wall)["p95"] if base_sql and base_sql.wall else None
        lines.append(f"\n{OP_TITLES[op]}")
        lines.append(
            f"  {'link':<30} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'p95/base API':>13} {'p95/base SQL':>13} {'CPU ms/op':>10}  by process"
        )
        js[op] = {}
        for name in LINK_ORDER:
            link = links.get(name)
            if link is None:
                continue
            s = link.summary()
            p95 = s["p95_ms"]
            r1 = f"{p95 / bp95:.2f}x" if bp95 else "-"
            r2 = f"{p95 / bsql95:.2f}x" if bsql95 else "-"
            by = ", ".join(f"{k} {v:.1f}" for k, v in s["cpu_ms_per_op"].items() if v >= 0.05)
            lines.append(
                f"  {name:<30} {s['n']:>4} {s['p50_ms']:>9.2f} {p95:>9.2f} {r1:>13} {r2:>13} {s['cpu_ms_total']:>10.2f}  {by}{'  [' + s['note'] + ']' if s['note'] else ''}"
            )
            js[op][name] = s | {
                "p95_over_baseline_api": round(p95 / bp95, 3) if bp95 else None,
                "p95_over_baseline_sql": round(p95 / bsql95, 3) if bsql95 else None,
            }
    return lines, js


async def main_async(args: argparse.Namespace) -> None:
    scale = SCALES[args.scale]
    started = datetime.now(UTC)
    log(f"ceiling study at {args.scale} turns, {args.calls} calls per link (load {load_avg()})")
    data = build_data(scale, args.calls, save_pool=args.calls * 4 + 2_000)
    run = await run_loom(data, args.calls, args.save_clients, args.save_seconds)
    add_statement_steps(run)
    facts: dict[str, Any] = {"load_avg": {"after_loom": load_avg()}, "chdb_client": {}, "baseline": {}}
    write(args, started, run, facts)  # a partial result, whatever happens next
    log("  loom stopped; the baseline loads, then links a and e back to back")
    baseline: Any = None
    try:
        baseline = await start_baseline(data, run.recall, args.pg)
        facts["baseline"] = {
            "tuning": baseline.tuning,
            "postgres": baseline.pg_version,
            "pgvector": baseline.pgvector_version,
        }
    except Exception as exc:
        facts["baseline"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        log(f"  baseline unavailable: {facts['baseline']['error']}")
    try:
        facts["load_avg"]["before_a"] = load_avg()
        try:
            run_direct(run)
        except Exception as exc:
            log(f"  link a failed: {type(exc).__name__}: {exc}")
        if not args.skip_chdb_client:
            try:
                facts["chdb_client"] = await run_chdb_client(run, data)
            except Exception as exc:
                facts["chdb_client"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        facts["load_avg"]["before_e"] = load_avg()
        if baseline is not None:
            try:
                await run_baseline(baseline, data, args.calls, run)
            except Exception as exc:
                facts["baseline"]["run_error"] = f"{type(exc).__name__}: {exc}"[:600]
                log(f"  link e failed: {facts['baseline']['run_error']}")
        facts["load_avg"]["after_e"] = load_avg()
    finally:
        if baseline is not None:
            await baseline.stop()
        if run.home is not None and not args.keep:
            shutil.rmtree(run.home, ignore_errors=True)
    write(args, started, run, facts)


def write(args: argparse.Namespace, started: datetime, run: LoomRun, facts: dict[str, Any]) -> None:
    lines, js = table(run)
    head = [
        f"Ceiling study, {args.scale} turns, {args.calls} calls per link, started {started:%Y-%m-%d %H:%M} UTC",
        f"machine: {os.cpu_count()} cores; load averages (1/5/15 min): {facts['load_avg']}",
        f"Loom recall@10 at 1 client {run.recall:.3f}; baseline: {facts['baseline']}",
        f"query embedding alone (MiniLM, in-process; inside c, d and the baseline API, not in a/b/e-SQL): {run.embed_ms}",
        f"idle CPU of Loom's processes before the links (ms of CPU per second of wall): {run.idle}",
        f"Loom processes: {run.procs}",
    ]
    text = "\n".join(head + lines)
    text += "\n\nsave_message from N clients over HTTP: " + json.dumps(run.save_load)
    text += "\n\nper-step breakdown of link c (mean ms per op):\n" + json.dumps(run.steps, indent=1)
    text += f"\n\na' notes: {facts['chdb_client']}"
    print(text)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{started:%Y-%m-%d-%H%M}-ceiling-{args.scale}"
    stem.with_suffix(".txt").write_text(text + "\n")
    raw = {
        op: {n: [round(w * 1000, 3) for w in lk.wall] for n, lk in links.items()}
        for op, links in run.links.items()
    }
    body = {
        "scale": SCALES[args.scale],
        "calls": args.calls,
        "started": started.isoformat(),
        "recall": run.recall,
        "embed_ms": run.embed_ms,
        "idle_cpu_ms_per_s": run.idle,
        "idle_cpu_ms_per_s_link_a": run.idle_a,
        "processes": run.procs,
        "links": js,
        "save_load": run.save_load,
        "steps": run.steps,
        "raw_ms": raw,
    } | facts
    stem.with_suffix(".json").write_text(json.dumps(body, indent=1, default=str))
    log(f"wrote {stem}.txt/.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="10k")
    p.add_argument("--calls", type=int, default=40, help="calls per link and op")
    p.add_argument("--save-clients", type=int, default=8)
    p.add_argument("--save-seconds", type=float, default=20.0)
    p.add_argument("--skip-chdb-client", action="store_true", help="leave out link a'")
    p.add_argument("--keep", action="store_true", help="keep Loom's home (the chdb data directory)")
    p.add_argument("--pg", default="auto", help="the baseline's PostgreSQL: auto|system|wheel")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
