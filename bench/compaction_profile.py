"""Step timings of conversation.compact for bench/compaction_bench.py (bench only).

Wraps, in this process only, the functions one compaction calls and records how long
each took, per compaction job (a context variable set when the job's body starts;
``Services.run`` is made to carry it into the I/O threads). Nothing here changes what
the code does.

Steps: ``pickup`` (the API's checks, enqueue and the worker taking the job: from the
request to the job body's start), ``window_read``, ``plan``, ``prompt``, ``llm``,
``summary_embed``, ``lease_wait``, ``marks_enter``, ``reread`` (the window re-read under
the lease), ``copies_read`` and ``embeddings_read`` (what settling the embedding rows
needs; the three run while the marks are raised), ``settle_plan``, ``insert_turns`` (the summary and the
tombstones), ``insert_embeddings`` (the summary's row and the settled ones), ``marks_exit``, ``reply`` (job end
to the API's answer). Steps that run at once overlap: their sum exceeds the total.
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
        from loom.ops.conversation import compacting
        from loom.store import compaction as store
        from loom.store import conversations as conv_store
        from loom.store import embeddings as emb_store

        store.live_turns = _sync("window_read", store.live_turns, first_only_as="reread")  # type: ignore[assignment]
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
        inner_run = compacting.run
        jobs = self.jobs

        async def run(svc: Any, model: Any, ns: str, agent: str, thread_id: str, *a: Any) -> Any:
            rec: dict[str, float] = {"_start": time.perf_counter()}
            RECORD.set(rec)
            jobs[thread_id] = rec
            result = await inner_run(svc, _async("summary_embed", model), ns, agent, thread_id, *a)
            rec["_end"] = time.perf_counter()
            return result

        compacting.run = run  # type: ignore[assignment]
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
    "copies_read",
    "embeddings_read",
    "settle_plan",
    "insert_turns",
    "insert_embeddings",
    "lease_release",
    "marks_exit",
    "reply",
]


def steps_of(rec: dict[str, float], t_request: float, t_answer: float) -> dict[str, float]:
    """The job's steps in ms, with pickup and reply from the API's own clock."""
    out = {k: v * 1000 for k, v in rec.items() if not k.startswith("_")}
    out["pickup"] = (rec["_start"] - t_request) * 1000
    out["reply"] = (t_answer - rec["_end"]) * 1000
    return out


async def legacy_retire(svc: Any, p: Any, summary: Any, row: Any) -> bool:
    """The retirement as it was before the compaction speed work (for a before/after in
    one run): under the lease, the marks raised, then one statement after another: the
    window re-read, the summary, its embedding row, the tombstones (INSERT ... SELECT),
    and settling (two reads, with every vector, and an insert)."""
    from loom.clock import next_version
    from loom.leases import thread_lease
    from loom.ops.conversation import compacting
    from loom.ops.conversation.deleting import settle
    from loom.store import compaction as store
    from loom.store import conversations as conv_store
    from loom.store import embeddings as emb_store
    from loom.store import search_marks
    from loom.store.deletion import _REVISABLE

    def tombstone(ch: Any, ids: list[str]) -> None:
        where = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}"
        replaced = {"tombstoned": "true", "tombstoned_at": "now64(3)", "tombstone_reason": "{why:String}"}
        exprs = [replaced.get(c, c) for c in _REVISABLE]
        ch.command(
            f"INSERT INTO conversations ({', '.join([*_REVISABLE, 'version'])}) "
            f"SELECT {', '.join(exprs)}, {{v:UInt64}} FROM conversations FINAL WHERE {where} "
            "AND msg_id IN {ids:Array(String)} AND NOT tombstoned",
            parameters={
                "ns": summary.namespace,
                "ag": summary.agent,
                "th": summary.thread_id,
                "ids": ids,
                "why": compacting.COMPACTED,
                "v": next_version(),
            },
        )

    def retire_sync() -> bool:
        now = {
            t.msg_id: t for t in store.live_turns(svc.ch, summary.namespace, summary.agent, summary.thread_id)
        }
        for t in p.replaced:
            cur = now.get(t.msg_id)
            if cur is None or cur.is_saved or cur.high_sensitivity or cur.content != t.content:
                return False
        conv_store.insert(svc.ch, [summary])
        emb_store.insert(svc.ch, [row])
        tombstone(svc.ch, [t.msg_id for t in p.replaced])
        settle(svc, summary.namespace, summary.thread_id)
        return True

    pair = [(summary.namespace, summary.thread_id)]
    async with (
        thread_lease(svc.redis, summary.namespace, summary.thread_id, wait_s=30.0),
        search_marks.changing(svc.redis, svc.ch, svc.run, pair),
    ):
        return bool(await svc.run(retire_sync))
