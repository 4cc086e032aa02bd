"""The embedder in a worker process: built at start-up, micro-batched, and the job
bodies of `embed_turns` and `reembed_rows`.

* The embedder is built from settings (LOOM_EMBEDDER minilm | openai | fake, its URL,
  model, key and timeout) by a STARTUP_HOOK, unless one was installed already with
  :func:`set_embedder` (tests swap in failing, slow or spying ones). It is read again
  for every model call, so a swap takes effect at once.
* The model batcher (:mod:`loom.providers.embedders.batcher`) merges the texts of every
  concurrent job of the process into model calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from loom import failures, jobs
from loom import logging as loom_logging
from loom.jobs import EmbedTurn
from loom.ops.embedding.client import wait_gate
from loom.ops.embedding.recovery import recover
from loom.ops.embedding.writer import EmbedPipeline, Outcome, write_deadline_ns
from loom.providers import embedders
from loom.providers.embedders import Embedder, build_embedder
from loom.providers.embedders.batcher import (
    ModelBatcher as ModelBatcher,  # the bench builds one as a worker does
)
from loom.providers.embedders.batcher import current_embedder as current_embedder
from loom.providers.embedders.batcher import has_embedder, model_parallelism
from loom.providers.embedders.batcher import set_embedder as set_embedder
from loom.replies import Reply, push_reply
from loom.settings import Settings
from workers.context import WorkerContext, services

log = loom_logging.get("loom.worker.embedding")

PIPELINE: Final = "conversation.embed_pipeline"
# Turns written and answered together. Larger parts mean fewer inserts and replies (on
# 2 cores, with the model CPU-bound, that beats answering each model call's turns as
# soon as they are done: measured 90 vs 72 single-turn appends/s at 32 clients).
# Answering a round of single-turn appends in two halves, so that the model embeds
# one while the other is written, measured worse as well: twice the inserts, and
# each costs the engine more CPU than the model idles meanwhile.
REPLY_PART = 256
BATCHER: Final = "conversation.model_batcher"


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


# -- hooks (registered in workers/main.py) ------------------------------------------


async def startup(ctx: WorkerContext) -> None:
    svc = services(ctx)
    if not has_embedder():
        embedder = embedder_from_settings(svc.settings)
        load = getattr(embedder, "load", None)
        if callable(load):  # warm the model before the first job waits on it
            await asyncio.get_running_loop().run_in_executor(None, load)
        set_embedder(embedder)
    batcher = ModelBatcher(parallel=model_parallelism())
    ctx[BATCHER] = batcher
    ctx[PIPELINE] = EmbedPipeline(svc, batcher)


async def shutdown(ctx: WorkerContext) -> None:
    pipeline: EmbedPipeline | None = ctx.pop(PIPELINE, None)
    if pipeline is not None:
        await pipeline.close()
    batcher: ModelBatcher | None = ctx.pop(BATCHER, None)
    if batcher is not None:
        await batcher.close()


# -- job bodies ---------------------------------------------------------------------


async def _reply(ctx: WorkerContext, job: jobs.Replied, reply: Reply) -> dict[str, Any]:
    """Answer the awaiting API (when the job names its reply list); the job's result."""
    if job.reply:
        await push_reply(services(ctx), job.reply, reply.model_copy(update={"job": job.job}))
    return reply.as_json()


async def _refuse(ctx: WorkerContext, payload: Any, exc: Exception) -> dict[str, Any]:
    """A payload this build cannot read: logged loudly, and the awaiting API (when the
    payload names its reply list) answered at once with the error, so that it fails
    open now rather than when its wait runs out."""
    log.error("job payload refused", error=str(exc))  # names fields and versions, never a value
    reply = Reply(error=failures.failure(exc))
    if isinstance(payload, dict) and isinstance(payload.get("reply"), str) and payload["reply"]:
        await push_reply(
            services(ctx), payload["reply"], reply.model_copy(update={"job": str(payload.get("job", ""))})
        )
    return reply.as_json()


async def embed_turns(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
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
        await _reply(ctx, job, Reply(part=lo, outcomes=[(o.status, o.error) for o in outcomes]))

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
        return Reply(outcomes=[(o.status, o.error) for o in outcomes]).as_json()
    except Exception as exc:
        log.error("embed_turns failed", error=failures.detail(exc), turns=len(turns))
        return await _reply(ctx, job, Reply(error=failures.failure(exc)))


async def recover_embeddings(ctx: WorkerContext) -> dict[str, Any]:
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


async def reembed_rows(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        job = jobs.read(jobs.ReembedRowsJob, payload)
    except jobs.PayloadRefused as exc:
        await _refuse(ctx, payload, exc)
        raise
    try:
        reply = Reply(counts=await ctx[PIPELINE].reembed(job.rows))
    except Exception as exc:
        log.error("reembed_rows failed", error=failures.detail(exc), rows=len(job.rows))
        reply = Reply(error=failures.failure(exc))
    return await _reply(ctx, job, reply)
