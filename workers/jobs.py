"""The arq job functions. Each is thin: it reads its typed payload (loom.jobs) and calls an op."""

from __future__ import annotations

from typing import Any

from loom import jobs
from loom.ops.conversation.lifecycle import compacting, titler_tick
from loom.ops.conversation.lifecycle.compaction_gate import CompactionGate
from loom.ops.erasure import requesting
from loom.ops.memory import extraction
from loom.ops.portability import embedding as import_embedding
from loom.ops.webhooks import delivery
from loom.services import Slot
from workers import embed_jobs
from workers.context import WorkerContext


async def ping(ctx: WorkerContext) -> str:
    """Used by health checks and tests: proves a worker is consuming the queue."""
    return "pong"


async def embed_turns(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Embed the turns one API flush stored; the reply goes to the waiting API process."""
    return await embed_jobs.embed_turns(ctx, payload)


async def reembed_rows(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Re-embed a page of embedding rows from the text each keeps (conversation.reembed)."""
    return await embed_jobs.reembed_rows(ctx, payload)


async def recover_embeddings(ctx: WorkerContext) -> dict[str, Any]:
    """Embed the user and assistant turns a crash left with no embedding row (cron)."""
    return await embed_jobs.recover_embeddings(ctx)


async def erasure_remove(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Remove an erasure's rows from disk, resuming at its first step not done."""
    job = jobs.read(jobs.ErasureRemoveJob, payload)
    req = await requesting.run_removal(ctx["loom"], job.erasure_id)
    return {"erasure_id": req.erasure_id, "state": req.state, "steps_done": req.steps_done}


async def compact_thread(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """conversation.compact's work: summarise, embed, retire (the API awaits the result)."""
    job = jobs.read(jobs.CompactThreadJob, payload)
    result = await compacting.run(
        ctx["loom"],
        ctx[embed_jobs.PIPELINE].model,
        job.namespace,
        job.agent,
        job.thread_id,
        job.keep_recent,
        job.min_to_compact,
        compaction_gate(ctx),
    )
    answer = compacting.as_job_result(result)
    await compacting.push_answer(ctx["loom"], ctx["job_id"], answer)
    await compacting.announce(ctx["loom"], job.namespace, result)
    return answer


COMPACT_GATE = "conversation.compact_gate"
_GATE: Slot[CompactionGate] = Slot(COMPACT_GATE)


def compaction_gate(ctx: WorkerContext) -> CompactionGate:
    """The process's compaction gate (loom.ops.conversation.lifecycle.compaction_gate), made at its
    first compaction from LOOM_COMPACT_CONCURRENCY and LOOM_COMPACT_PACE. arq hands each
    job its own copy of the worker's ctx, so the gate lives on the process's Services,
    which every job shares (kept in the job's ctx, each job had a gate of its own: no
    bound at all)."""
    svc = ctx["loom"]
    cfg = svc.settings
    return _GATE.made(svc, lambda: CompactionGate(cfg.compact_concurrency, cfg.compact_pace))


async def conversation_titler(ctx: WorkerContext) -> dict[str, Any]:
    """The conversation_titler's tick (cron): a pass when the live settings say one is due."""
    report = await titler_tick.tick(ctx["loom"])
    return {"ran": report.ran, "titled": report.titled, "refused": report.refused}


async def memory_extract(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The deferred half of memory.set_from_messages: extract and decide over stored evidence."""
    return await extraction.run_job(ctx["loom"], payload, str(ctx["job_id"]))


async def webhook_deliver(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """One attempt to POST a signed event to a webhook; a failed one enqueues the next."""
    return await delivery.deliver(ctx["loom"], payload)


async def import_embed(ctx: WorkerContext, payload: dict[str, Any]) -> dict[str, Any]:
    """One run of an import's background embedding, through this worker's model batcher."""
    job = jobs.read(jobs.ImportEmbedJob, payload)
    return await import_embedding.run(ctx["loom"], ctx[embed_jobs.PIPELINE].model, job.job_id)


async def import_embed_tick(ctx: WorkerContext) -> dict[str, Any]:
    """Resume the background embedding of every import not done (cron; after a crash)."""
    return {"enqueued": await import_embedding.tick(ctx["loom"])}


FUNCTIONS: list[Any] = [
    ping,
    embed_turns,
    reembed_rows,
    erasure_remove,
    compact_thread,
    memory_extract,
    webhook_deliver,
    import_embed,
]
