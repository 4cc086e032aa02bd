"""Step timings of conversation.compact for bench/compaction_bench.py (bench only).

Wraps, in this process only, the functions one compaction calls and records how long
each took, per compaction job (a context variable set when the job's body starts;
``Services.run`` is made to carry it into the I/O threads). Nothing here changes what
the code does.

Steps: ``pickup`` (the API's checks, enqueue and the worker taking the job: from the
request to the job body's start), ``window_read``, ``plan``, ``prompt``, ``llm``,
``summary_embed``, ``lease_wait``, ``thread_read`` (now: the one read under the lease,
every agent's copies with their versions and the embedding rows), ``settle_plan``,
``insert_turns`` (the summary and the tombstones), ``insert_embeddings`` (the summary's
row and the settled ones), ``marks_raises`` (both raises of the change window, the
first now overlapping the summarizer call), ``reply`` (job end to the API's answer).
The job body as it was before session 13 (:func:`previous_run`) has ``marks_enter``,
``reread`` (the window re-read under the lease), ``copies_read`` and
``embeddings_read`` (the three run while the marks are raised) and ``marks_exit``
instead of ``thread_read``. Steps that run at once overlap: their sum exceeds the total.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

RECORD: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "compact_steps", default=None
)


def _add(step: str, took: float) -> None:
    rec = RECORD.get()
    if rec is not None:
        rec[step] = rec.get(step, 0.0) + took


def _sync(step: str, fn: Callable[..., Any], *, first_only_as: str | None = None) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            rec = RECORD.get()
            name = step
            if first_only_as is not None and rec is not None and step in rec:
                name = first_only_as
            _add(name, time.perf_counter() - t0)

    return wrapper


def _async(step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            _add(step, time.perf_counter() - t0)

    return wrapper


def _cm(enter: str, exit_: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        t0 = time.perf_counter()
        cm = fn(*args, **kwargs)
        value = await cm.__aenter__()
        _add(enter, time.perf_counter() - t0)
        try:
            yield value
        except BaseException as exc:
            t1 = time.perf_counter()
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            _add(exit_, time.perf_counter() - t1)
        else:
            t1 = time.perf_counter()
            await cm.__aexit__(None, None, None)
            _add(exit_, time.perf_counter() - t1)

    return wrapper


class Profiler:
    """Installs the wrappers; ``jobs`` maps a thread id to its compaction's steps."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, float]] = {}

    def install(self, worker_svc: Any) -> None:
        from loom.ops.conversation.lifecycle import compacting
        from loom.store import compaction as store
        from loom.store import conversations as conv_store
        from loom.store import embeddings as emb_store

        store.live_turns = _sync("window_read", store.live_turns, first_only_as="reread")  # type: ignore[assignment]
        store.thread_now = _sync("thread_read", store.thread_now)  # type: ignore[assignment]
        compacting.search_marks.raise_marks = _async(  # type: ignore[assignment]
            "marks_raises", compacting.search_marks.raise_marks
        )
        compacting.plan = _sync("plan", compacting.plan)  # type: ignore[assignment]
        compacting.prompt_messages = _sync("prompt", compacting.prompt_messages)  # type: ignore[assignment]
        compacting._summarise = _async("llm", compacting._summarise)  # type: ignore[assignment]
        conv_store.insert = _sync("insert_turns", conv_store.insert)  # type: ignore[assignment]
        emb_store.insert = _sync("insert_embeddings", emb_store.insert)  # type: ignore[assignment]
        compacting.deletion.copies = _sync("copies_read", compacting.deletion.copies)  # type: ignore[assignment]
        compacting.deletion.thread_embeddings = _sync(  # type: ignore[assignment]
            "embeddings_read", compacting.deletion.thread_embeddings
        )
        compacting.settle_writes = _sync("settle_plan", compacting.settle_writes)  # type: ignore[assignment]
        compacting.thread_lease = _cm("lease_wait", "lease_release", compacting.thread_lease)  # type: ignore[assignment]
        compacting.search_marks.changing = _cm(  # type: ignore[assignment]
            "marks_enter", "marks_exit", compacting.search_marks.changing
        )
        self.current = compacting.run
        self.inner: Callable[..., Any] = self.current  # which job body runs (now or previous_run)
        jobs = self.jobs
        profiler = self

        async def run(svc: Any, model: Any, ns: str, agent: str, thread_id: str, *a: Any) -> Any:
            rec: dict[str, float] = {"_start": time.perf_counter()}
            RECORD.set(rec)
            jobs[thread_id] = rec
            result = await profiler.inner(svc, _async("summary_embed", model), ns, agent, thread_id, *a)
            rec["_end"] = time.perf_counter()
            return result

        compacting.run = run  # type: ignore[assignment]
        announce = compacting.announce

        async def announce_once(svc: Any, ns: str, out: Any) -> None:
            if profiler.inner is not previous_run:  # previous_run sent it before the answer
                await announce(svc, ns, out)

        compacting.announce = announce_once  # type: ignore[assignment]
        self._carry_context(worker_svc)

    @staticmethod
    def _carry_context(svc: Any) -> None:
        import asyncio

        def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            ctx = contextvars.copy_context()
            return loop.run_in_executor(svc.executor, functools.partial(ctx.run, fn, *args, **kwargs))

        svc.run = run


STEPS = [
    "pickup",
    "window_read",
    "plan",
    "prompt",
    "llm",
    "summary_embed",
    "lease_wait",
    "marks_enter",
    "reread",
    "thread_read",
    "copies_read",
    "embeddings_read",
    "settle_plan",
    "insert_turns",
    "insert_embeddings",
    "lease_release",
    "marks_exit",
    "marks_raises",
    "reply",
]


def steps_of(rec: dict[str, float], t_request: float, t_answer: float) -> dict[str, float]:
    """The job's steps in ms, with pickup and reply from the API's own clock."""
    out = {k: v * 1000 for k, v in rec.items() if not k.startswith("_")}
    out["pickup"] = (rec["_start"] - t_request) * 1000
    out["reply"] = (t_answer - rec["_end"]) * 1000
    return out


async def previous_run(
    svc: Any,
    model: Any,
    ns: str,
    agent: str,
    thread_id: str,
    keep_recent: int,
    min_to_compact: int,
    gate: Any = None,
) -> Any:
    """The job body as it was before session 13's speed work (for a before/after in one
    run): the window read; the summarizer and the embedding; then under the lease the
    marks raised while three reads run (the window again, every agent's copies, the
    embedding rows without vectors), two inserts at once, the marks raised again."""
    import asyncio
    import contextlib

    from loom.clock import next_version
    from loom.ops.conversation.common import EMBED_CHARS, embed_text, model_text
    from loom.ops.conversation.lifecycle import compacting as c
    from loom.ops.conversation.lifecycle.deleting import ThreadState, with_vectors
    from loom.store import compaction as store
    from loom.store import conversations as conv_store
    from loom.store import deletion
    from loom.store import embeddings as emb_store

    def current(p: Any, turns: list[Any]) -> list[Any] | None:
        now = {t.msg_id: t for t in turns}
        out = []
        for t in p.replaced:
            cur = now.get(t.msg_id)
            if cur is None or cur.is_saved or cur.high_sensitivity or cur.content != t.content:
                return None
            out.append(cur)
        return out

    async def retire(p: Any, summary: Any, row: Any) -> bool:
        async with c.thread_lease(svc.redis, ns, thread_id, wait_s=30.0):
            reads = asyncio.gather(
                svc.run(store.live_turns, svc.ch, ns, agent, thread_id),
                svc.run(deletion.copies, svc.ch, ns, thread_id, EMBED_CHARS),
                svc.run(deletion.thread_embeddings, svc.ch, ns, thread_id, vectors=False),
            )
            try:
                async with c.search_marks.changing(svc.redis, svc.ch, svc.run, [(ns, thread_id)]):
                    turns, copies, rows = await reads
                    cur = current(p, turns)
                    if cur is None:
                        return False
                    state = ThreadState(copies, rows)
                    state.retired(agent, [t.msg_id for t in cur])
                    writes, settled = c.settle_writes(state)
                    if settled.handed_over:
                        writes = await svc.run(with_vectors, svc, writes)
                    await asyncio.gather(
                        svc.run(conv_store.insert, svc.ch, [summary, *c._tombstoned(cur)]),
                        svc.run(emb_store.insert, svc.ch, [row, *writes]),
                    )
                    return True
            finally:
                if not reads.done():
                    reads.cancel()
                    with contextlib.suppress(BaseException):
                        await reads

    out = c.CompactResult(thread_id, agent)
    cfg = svc.settings
    gate = gate or asyncio.Semaphore(1)
    async with gate:
        turns = await svc.run(store.live_turns, svc.ch, ns, agent, thread_id)
    p = c.plan(turns, keep_recent, cfg.compact_prompt_budget_chars, cfg.compact_summary_allowance_chars)
    if p.new_turns < max(1, min_to_compact):
        return out.done(c.NOTHING if p.new_turns == 0 else c.BELOW_MIN)
    text, out.tokens_in, out.tokens_out = await c._summarise(
        svc, c.prompt_messages(p, cfg.compact_prompt_budget_chars)
    )
    summary = c._summary_turn(p, ns, agent, thread_id, text, out.tokens_out)
    got = await model([model_text(embed_text(text), "system", True, cfg.embed_speaker_prefix)])
    row = emb_store.EmbeddingRow(
        namespace=ns,
        thread_id=thread_id,
        msg_id=summary.msg_id,
        agent=agent,
        role="system",
        run_id=summary.run_id,
        user_id=summary.user_id,
        ts=summary.ts,
        text=embed_text(text),
        embedding=got.vectors[0],
        model=got.model_id,
        is_summary=True,
        version=next_version(),
    )
    async with gate:
        if not await retire(p, summary, row):
            return out.done(c.WINDOW_CHANGED)
    out.messages_summarized = p.new_turns
    out.summary_msg_id = summary.msg_id
    await c.announce(svc, ns, out)  # then sent before the answer
    return out


# -- CPU per statement and per compaction ---------------------------------------------


class CpuMeter:
    """CPU seconds (user + system) of the processes a compaction runs in: this one (the
    API and the in-process worker), the ClickHouse endpoint's and Redis's. Less noisy than
    wall time on a loaded machine: another process's load slows a step but costs it
    little CPU of its own."""

    def __init__(self, **pids: int | None) -> None:
        import os

        import psutil

        self.procs = {"bench": psutil.Process(os.getpid())}
        self.procs.update({name: psutil.Process(pid) for name, pid in pids.items() if pid})

    def now(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            t = proc.cpu_times()
            out[name] = t.user + t.system
        return out

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """Milliseconds of CPU per process between two readings."""
        return {k: (after[k] - before[k]) * 1000 for k in before}


def statement_costs(svc: Any, meter: CpuMeter, ns: str, agent: str, thread_id: str, reps: int) -> list[str]:
    """Each ClickHouse statement (and Redis step) of one compaction of `thread_id` (a
    200-turn thread not yet compacted), run `reps` times one after another: wall and CPU
    per call, by process. The inserts write a scratch thread (nothing of `thread_id`
    changes)."""
    import statistics
    import time
    from dataclasses import replace

    from loom.clock import next_version
    from loom.ops.conversation.common import EMBED_CHARS
    from loom.store import compaction as store
    from loom.store import conversations as conv_store
    from loom.store import deletion, search_marks
    from loom.store import embeddings as emb_store
    from loom.store import namespaces as ns_store

    turns = store.live_turns(svc.ch, ns, agent, thread_id)
    rows = deletion.thread_embeddings(svc.ch, ns, thread_id, vectors=True)
    vec = next(r.embedding for r in rows if len(r.embedding))
    scratch = f"scratch-{thread_id}"

    def conv_rows() -> list[Any]:
        v = next_version()
        summary = replace(
            turns[0], thread_id=scratch, msg_id=f"s_{v}", role="system", is_summary=True, version=v
        )
        return [summary] + [
            replace(t, thread_id=scratch, tombstoned=True, tombstone_reason="compacted", version=v)
            for t in turns[:-10]
        ]

    def emb_rows() -> list[Any]:
        v = next_version()
        live = [replace(r, thread_id=scratch, version=v) for r in rows[:1]]
        live[0] = replace(live[0], embedding=vec)
        dead = [
            replace(r, thread_id=scratch, text="", embedding=[], tombstoned=True, version=v)
            for r in rows[1:191]
        ]
        return live + dead

    steps: list[tuple[str, Any]] = [
        ("namespace config (API check)", lambda: ns_store.get(svc.ch, ns)),
        (
            "window read (live_turns; before: again under the lease)",
            lambda: store.live_turns(svc.ch, ns, agent, thread_id),
        ),
        (
            "before: copies read (every agent's rows)",
            lambda: deletion.copies(svc.ch, ns, thread_id, EMBED_CHARS),
        ),
        (
            "before: embedding rows read, no vectors",
            lambda: deletion.thread_embeddings(svc.ch, ns, thread_id, vectors=False),
        ),
        (
            "now: the one read under the lease (thread_now)",
            lambda: store.thread_now(svc.ch, ns, thread_id, EMBED_CHARS),
        ),
        (
            "search_marks insert (one raise's CH half)",
            lambda: search_marks.record(svc.ch, [(ns, thread_id)], 1),
        ),
        ("insert summary + 190 tombstones", lambda: conv_store.insert(svc.ch, conv_rows())),
        ("insert summary's row + 190 settled rows", lambda: emb_store.insert(svc.ch, emb_rows())),
    ]
    lines = [f"   per statement, {reps} calls one after another: wall p50 ms; CPU ms per call by process"]
    for label, fn in steps:
        fn()  # warm
        walls = []
        before = meter.now()
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            walls.append((time.perf_counter() - t0) * 1000)
        cpu = CpuMeter.spent(before, meter.now())
        per = "  ".join(f"{k} {v / reps:5.1f}" for k, v in cpu.items())
        lines.append(f"     {label:<44} wall {statistics.median(walls):6.1f}   cpu: {per}")
    return lines
