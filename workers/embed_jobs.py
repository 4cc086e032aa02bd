"""The embedder in a worker process: built at start-up, micro-batched, and the job
bodies of `embed_turns` and `reembed_rows`.

* The embedder is built from settings (LOOM_EMBEDDER minilm | openai | fake, its URL,
  model, key and timeout) by a STARTUP_HOOK, unless one was installed already with
  :func:`set_embedder` (tests swap in failing, slow or spying ones). It is read again
  for every model call, so a swap takes effect at once.
* :class:`ModelBatcher` merges the texts of every concurrent job of the process into
  model calls (identical texts embedded once), run in threads of their own so the
  event loop keeps taking jobs and writing vectors meanwhile: `parallel` calls at once
  (one per core, up to 4), each single-threaded. While calls run, the next texts queue
  up; a freed slot takes what is queued, so under load the model never idles and never
  waits for a batch to fill. A call takes at most `max_texts` (8): concurrent
  single-turn appends then split into groups that take turns, some groups' texts in
  the model while the others' vectors are written and their clients send their next
  turns, instead of all waiting on one call and leaving the model idle in between.
  Measured on 2 cores (MiniLM int8, ~200-character texts): two single-threaded calls
  of 8 texts at a time embed as fast as one two-threaded call of 32 (~180 texts/s
  each way), and ~10% faster while another process takes 30% of a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loom import failures, jobs
from loom import logging as loom_logging
from loom.jobs import EmbedTurn
from loom.ops.embedding.client import wait_gate
from loom.ops.embedding.recovery import recover
from loom.ops.embedding.writer import EmbedPipeline, ModelResult, Outcome, write_deadline_ns
from loom.providers import embedders
from loom.providers.embedders import Embedder, build_embedder
from loom.replies import push_reply
from loom.settings import Settings
from workers.context import services

log = loom_logging.get("loom.worker.embedding")

PIPELINE = "conversation.embed_pipeline"
# Turns written and answered together. Larger parts mean fewer inserts and replies (on
# 2 cores, with the model CPU-bound, that beats answering each model call's turns as
# soon as they are done: measured 90 vs 72 single-turn appends/s at 32 clients).
# Answering a round of single-turn appends in two halves, so that the model embeds
# one while the other is written, measured worse as well: twice the inserts, and
# each costs the engine more CPU than the model idles meanwhile.
REPLY_PART = 256
BATCHER = "conversation.model_batcher"

_holder: dict[str, Embedder | None] = {"embedder": None}


def set_embedder(embedder: Embedder | None) -> Embedder | None:
    """Install the process's embedder (None: build from settings at the next start-up).
    Returns the one it replaces."""
    previous = _holder["embedder"]
    _holder["embedder"] = embedder
    return previous


def current_embedder() -> Embedder:
    embedder = _holder["embedder"]
    if embedder is None:
        raise RuntimeError("no embedder installed in this worker process")
    return embedder


def embedder_from_settings(settings: Settings, *, single_threaded: bool = True) -> Embedder:
    """The embedder LOOM_EMBEDDER names. A worker runs MiniLM single-threaded and makes
    several calls at once (see ModelBatcher): two independent threads lose less than
    one call split over two threads when another process takes a core for a moment."""
    extra = embedders.single_threaded(settings.embedder) if single_threaded else {}
    return build_embedder(
        settings.embedder,
        url=settings.embedder_url,
        model=settings.embedder_model,
        api_key=settings.embedder_api_key,
        timeout_seconds=settings.embedder_timeout_seconds,
        **extra,
    )


@dataclass
class _Request:
    texts: list[str]
    future: asyncio.Future[ModelResult]
    vectors: list[np.ndarray | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    model_id: str = ""
    taken: int = 0  # texts handed to a model call so far
    done: int = 0  # texts answered so far


class ModelBatcher:
    """Model calls carrying the queued texts of every caller, `parallel` at a time."""

    def __init__(self, max_texts: int = 8, parallel: int = 2) -> None:
        self.max_texts = max_texts
        self.parallel = parallel
        self._queue: list[_Request] = []
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(parallel)
        self._executor = ThreadPoolExecutor(parallel, thread_name_prefix="loom-embed")
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.texts = 0

    async def __call__(self, texts: list[str]) -> ModelResult:
        if not texts:
            return ModelResult([], [], "")
        loop = asyncio.get_running_loop()
        req = _Request(list(texts), loop.create_future(), [None] * len(texts), [""] * len(texts))
        self._queue.append(req)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="model-batcher")
        return await req.future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for call in list(self._calls):
            call.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _take(self) -> list[tuple[_Request, int, int]]:
        """Slices (request, start, end) of queued texts, up to max_texts in all."""
        parts: list[tuple[_Request, int, int]] = []
        room = self.max_texts
        for req in self._queue:
            if room <= 0:
                break
            n = min(room, len(req.texts) - req.taken)
            if n > 0:
                parts.append((req, req.taken, req.taken + n))
                req.taken += n
                room -= n
        self._queue = [r for r in self._queue if r.taken < len(r.texts)]
        return parts

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._slots.acquire()
            parts = self._take()
            if not parts:
                self._slots.release()
                continue
            call = loop.create_task(self._call(parts), name="model-call")
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, parts: list[tuple[_Request, int, int]]) -> None:
        try:
            unique: dict[str, int] = {}
            for req, start, end in parts:
                for text in req.texts[start:end]:
                    unique.setdefault(text, len(unique))
            texts = list(unique)
            vectors: Any = None
            error = ""
            model_id = ""
            try:
                embedder = current_embedder()
                model_id = embedder.model_id
                vectors = await asyncio.get_running_loop().run_in_executor(
                    self._executor, embedder.embed, texts
                )
                if len(vectors) != len(texts):
                    raise RuntimeError(f"embedder returned {len(vectors)} vectors for {len(texts)} texts")
            except Exception as exc:  # fail-open: every text of the call records the error
                error = failures.embed_failure(exc)  # a code: the provider's own text stays in the log
                log.warning("embedding call failed", error=failures.detail(exc, sent=texts), texts=len(texts))
            self.calls += 1
            self.texts += len(texts)
            for req, start, end in parts:
                for i in range(start, end):
                    if error:
                        req.errors[i] = error
                    else:
                        req.vectors[i] = vectors[unique[req.texts[i]]]
                req.model_id = model_id
                req.done += end - start
                if req.done == len(req.texts) and not req.future.done():
                    req.future.set_result(ModelResult(req.vectors, req.errors, req.model_id))
        finally:
            self._slots.release()


def model_parallelism() -> int:
    """Concurrent model calls per worker process: one per core, up to 4."""
    return max(1, min(os.cpu_count() or 1, 4))


# -- hooks (registered in workers/main.py) ------------------------------------------


async def startup(ctx: dict[str, Any]) -> None:
    svc = services(ctx)
    if _holder["embedder"] is None:
        embedder = embedder_from_settings(svc.settings)
        load = getattr(embedder, "load", None)
        if callable(load):  # warm the model before the first job waits on it
            await asyncio.get_running_loop().run_in_executor(None, load)
        set_embedder(embedder)
    batcher = ModelBatcher(parallel=model_parallelism())
    ctx[BATCHER] = batcher
    ctx[PIPELINE] = EmbedPipeline(svc, batcher)


async def shutdown(ctx: dict[str, Any]) -> None:
    pipeline: EmbedPipeline | None = ctx.pop(PIPELINE, None)
    if pipeline is not None:
        await pipeline.close()
    batcher: ModelBatcher | None = ctx.pop(BATCHER, None)
    if batcher is not None:
        await batcher.close()


# -- job bodies ---------------------------------------------------------------------


async def _reply(ctx: dict[str, Any], job: jobs.Replied, msg: dict[str, Any]) -> None:
    if job.reply:
        await push_reply(services(ctx), job.reply, {"job": job.job, **msg})


async def _refuse(ctx: dict[str, Any], payload: Any, exc: Exception) -> dict[str, Any]:
    """A payload this build cannot read: logged loudly, and the awaiting API (when the
    payload names its reply list) answered at once with the error, so that it fails
    open now rather than when its wait runs out."""
    log.error("job payload refused", error=str(exc))  # names fields and versions, never a value
    msg: dict[str, Any] = {"error": failures.failure(exc)}
    if isinstance(payload, dict) and isinstance(payload.get("reply"), str) and payload["reply"]:
        await push_reply(services(ctx), payload["reply"], {"job": str(payload.get("job", "")), **msg})
    return msg


async def embed_turns(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Each part (REPLY_PART turns) of the job is replied as soon as it is written; a
    failure replies an error for whatever is left (the API then records it, fail-open)."""
    try:
        job = jobs.read(jobs.EmbedTurnsJob, payload)
    except jobs.PayloadRefused as exc:
        await _refuse(ctx, payload, exc)
        raise
    turns: Sequence[EmbedTurn] = job.turns
    pipeline: EmbedPipeline = ctx[PIPELINE]

    async def on_part(lo: int, outcomes: list[Outcome]) -> None:
        await _reply(ctx, job, {"part": lo, "outcomes": [[o.status, o.error] for o in outcomes]})

    svc = services(ctx)
    gate = None
    if job.gate:
        # Longer than the API waits: past that, the API has recorded the error anyway.
        gate = wait_gate(svc.redis, job.gate, max(30.0, 2 * svc.settings.embed_wait_seconds))
    # A job with no enqueue stamp (0) has no write deadline.
    not_after = write_deadline_ns(svc.settings, job.at) if job.at else 0
    try:
        outcomes = await pipeline.embed_turns(
            turns, chunk=REPLY_PART, on_part=on_part, gate=gate, not_after_ns=not_after
        )
        return {"outcomes": [[o.status, o.error] for o in outcomes]}
    except Exception as exc:
        log.error("embed_turns failed", error=failures.detail(exc), turns=len(turns))
        msg: dict[str, Any] = {"error": failures.failure(exc)}
        await _reply(ctx, job, msg)
        return msg


async def recover_embeddings(ctx: dict[str, Any]) -> dict[str, Any]:
    """One embedding recovery pass (loom.ops.embedding.recovery) through this
    worker's model batcher. A failure (a backend down) is logged; the next pass goes on
    from the position the last finished page saved."""
    pipeline: EmbedPipeline = ctx[PIPELINE]
    try:
        report = await recover(services(ctx), pipeline.model)
    except Exception as exc:
        log.warning("embedding recovery pass failed", error=failures.detail(exc))
        return {"error": failures.failure(exc)}
    if report.embedded or report.failed:
        log.info("embedding recovery pass", **report.counts())
    return report.counts()


async def reembed_rows(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    try:
        job = jobs.read(jobs.ReembedRowsJob, payload)
    except jobs.PayloadRefused as exc:
        await _refuse(ctx, payload, exc)
        raise
    try:
        msg: dict[str, Any] = {"counts": await ctx[PIPELINE].reembed(job.rows)}
    except Exception as exc:
        log.error("reembed_rows failed", error=failures.detail(exc), rows=len(job.rows))
        msg = {"error": failures.failure(exc)}
    await _reply(ctx, job, msg)
    return msg
