"""An import's background embedding: the worker's pass over the turns an import stored.

An import stores turns far faster than a model embeds them, so import.write sends none
to the model: it leaves them to this pass (the arq job `import_embed`), which goes
through the import's window (loom.ops.portability.windows: its namespace, its token,
the span of insert times its turns landed in) in insert-time order, a page at a time,
and embeds each live user or assistant turn (or summary) that has no embedding row yet,
with the recovery pass's own rules and writer (loom.ops.embedding.recovery): a turn
that reads as high is never sent to the model; one deleted or embedded meanwhile is
left as it is; the vectors are written under the thread leases after a re-check.

The model is kept busy: each page's texts go to the worker's model batcher at once
(it merges them into calls, one per core), each part's vectors are written as soon as
its call returns, and the next page is read while this one is embedded. So the pass
runs at the model's rate (bench/studies/import_export.py measures the ratio).

One runner per import (a Redis lease); a run lasts at most SLICE_S (arq's job timeout
is 300 s), saves its position after every page (so a crash costs a page) and enqueues
the next run while work is left. The worker's tick (every TICK_S) enqueues a run for
every import whose embedding is not done, which resumes one after a crash. It is done
once the import ended (done or stopped) and the pass reached the end of its window;
then the window is removed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from loom import failures, redis_keys
from loom import logging as loom_logging
from loom.clock import next_version, utcnow
from loom.jobs import IMPORT_EMBED, ImportEmbedJob, build
from loom.leases import Lease, kept_renewed
from loom.ops.conversation.common import EMBED_CHARS
from loom.ops.embedding import recovery
from loom.ops.embedding.writer import ModelFn, write_recovered
from loom.ops.portability import windows
from loom.queue import QUEUE, wake_workers
from loom.services import Services
from loom.store import embed_recovery as rec_store
from loom.store import portability as store

log = loom_logging.get("loom.portability.embedding")

PAGE = 1_000  # transcript rows read per page
PART = 64  # texts per model request (the batcher splits them into its calls)
PROGRESS_S = 2.0  # the counts are saved at least this often while a page is embedded
SLICE_S = 200.0  # one run at most this long (arq's job timeout is 300 s)
LEASE_TTL_MS = 30_000
TICK_S = 30  # the worker's tick: resume every import whose embedding is not done
PENDING, RUNNING, DONE = "pending", "running", "done"


def _position(p: dict[str, Any], job: store.Job) -> rec_store.Position:
    if not p:  # before the window's first turn
        return rec_store.Position(created_at=job.window_start - timedelta(milliseconds=1), namespace="")
    return rec_store.Position(
        created_at=datetime.fromisoformat(p["created_at"]),
        namespace=p["namespace"],
        agent=p["agent"],
        thread_id=p["thread_id"],
        msg_id=p["msg_id"],
    )


def _position_dict(p: rec_store.Position) -> dict[str, Any]:
    out = asdict(p)
    at = p.created_at if p.created_at.tzinfo else p.created_at.replace(tzinfo=UTC)
    out["created_at"] = at.isoformat()
    return out


async def enqueue(svc: Services, job_id: str, *, defer_s: float = 0.0) -> None:
    """Ask the worker pool for a run (a run already going makes it a no-op)."""
    payload = build(ImportEmbedJob, job_id=job_id)
    kwargs: dict[str, Any] = {"_queue_name": QUEUE}
    if defer_s:
        kwargs["_defer_by"] = timedelta(seconds=defer_s)
    await svc.arq.enqueue_job(IMPORT_EMBED, payload, **kwargs)
    if not defer_s:
        await wake_workers(svc.redis)


async def run(svc: Services, model: ModelFn, job_id: str, *, slice_s: float = SLICE_S) -> dict[str, Any]:
    """One run of an import's embedding (see the module docstring)."""
    lease = Lease(svc.redis, redis_keys.import_embed_lease(job_id), LEASE_TTL_MS)
    if not await lease.try_acquire():
        return {"ran": False, "done": False}
    async with kept_renewed(lease, f"import-embed-{job_id}") as keeper:
        answer, seen = await _run(svc, model, job_id, slice_s, keeper)
    if not answer["done"]:
        # A batch committed while this run held the lease asked for a run that found it
        # taken: read the job again now that the lease is free (a batch committed after
        # this read asks for a run that will get it).
        now = await svc.run(store.job_by_id, svc.ch, job_id)
        if now is not None and (now.landed_until, now.state) != seen:
            await enqueue(svc, job_id)
    return answer


async def _run(
    svc: Services, model: ModelFn, job_id: str, slice_s: float, keeper: asyncio.Task[None]
) -> tuple[dict[str, Any], tuple[datetime, str]]:
    """The run; its answer and the job as it last read it (how far its turns had landed,
    its state)."""
    job = await svc.run(store.job_by_id, svc.ch, job_id)
    if job is None:
        return {"ran": False, "done": True, "reason": "no such job"}, (datetime.min, "")
    found = await svc.run(store.embedding, svc.ch, job.namespace, job_id)
    row = found or store.Embedding(
        namespace=job.namespace, job_id=job_id, state=PENDING, position={}, counts={}
    )
    report = recovery.RecoveryReport(ran=True)
    pos = _position(row.position, job)
    started, base = time.monotonic(), dict(row.counts)
    ahead: asyncio.Future[list[rec_store.Landed]] | None = None
    finished = False
    try:
        while time.monotonic() - started < slice_s and not keeper.done():
            # Every turn of the job's committed batches has landed by `landed_until`.
            job = await svc.run(store.job_by_id, svc.ch, job_id) or job
            rows = await ahead if ahead is not None else []
            ahead = None
            if not rows:  # (a page read ahead may predate the job's latest batch)
                rows = await _read(svc, job, pos, _naive(job.landed_until))
            if rows:
                # The next page is read while this one is embedded.
                ahead = asyncio.ensure_future(_read(svc, job, rows[-1].position, _naive(job.landed_until)))
                kept = pos  # the position moves once the whole page is done

                async def progress(at: rec_store.Position = kept) -> None:
                    nonlocal row
                    row = _progress(row, base, at, report, started, RUNNING)
                    await svc.run(store.put_embedding, svc.ch, row)

                await _embed_page(svc, model, rows, report, progress)
                pos = rows[-1].position
                row = _progress(row, base, pos, report, started, RUNNING)
                await svc.run(store.put_embedding, svc.ch, row)
                continue
            # Caught up: done once the import has ended; else its next batch asks again.
            finished = job.state != "running"
            break
    finally:
        if ahead is not None:
            ahead.cancel()
    row = _progress(row, base, pos, report, started, DONE if finished else row.state)
    await svc.run(store.put_embedding, svc.ch, row)
    if finished:
        await windows.remove(svc.redis, job_id)
    elif time.monotonic() - started >= slice_s or keeper.done():
        await enqueue(svc, job_id, defer_s=1.0)  # work is left
    return {"ran": True, **report.counts(), "done": finished}, (job.landed_until, job.state)


def _naive(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo else at


async def _read(
    svc: Services, job: store.Job, after: rec_store.Position, upto: datetime
) -> list[rec_store.Landed]:
    return await svc.run(
        rec_store.landed_after,
        svc.ch,
        after,
        upto,
        limit=PAGE,
        chars=EMBED_CHARS,
        namespace=job.namespace,
        appended_by=job.token_id,
    )


async def _embed_page(
    svc: Services,
    model: ModelFn,
    rows: Sequence[rec_store.Landed],
    report: recovery.RecoveryReport,
    progress: Callable[[], Awaitable[None]],
) -> None:
    """Embed a page, its parts at once; the counts are saved every PROGRESS_S meanwhile
    (a page takes a while at a local model's rate)."""
    missing = await recovery.to_embed(svc, rows, report)
    saved = time.monotonic()

    async def part(lo: int) -> None:
        nonlocal saved
        turns = [recovery.as_embed_turn(r) for r in missing[lo : lo + PART]]
        result = await model(recovery.model_texts(svc, turns))  # before any lease
        recovery.tally(await write_recovered(svc, turns, result), report)
        if time.monotonic() - saved >= PROGRESS_S:
            saved = time.monotonic()
            await progress()

    await asyncio.gather(*(part(lo) for lo in range(0, len(missing), PART)))


def _progress(
    row: store.Embedding,
    base: dict[str, int],
    pos: rec_store.Position,
    report: recovery.RecoveryReport,
    started: float,
    state: str,
) -> store.Embedding:
    done = {
        "embedded": report.embedded,
        "failed": report.failed,
        "skipped": report.skipped_deleted + report.skipped_present,
        "high": report.skipped_high,
        "scanned": report.scanned,
    }
    counts = {k: int(base.get(k, 0)) + v for k, v in done.items()}
    elapsed = max(time.monotonic() - started, 1e-6)
    return store.Embedding(
        namespace=row.namespace,
        job_id=row.job_id,
        state=state,
        position=_position_dict(pos) if pos.namespace else row.position,
        counts=counts,
        rate=round(report.embedded / elapsed, 1),
        updated_at=utcnow(),
        version=next_version(),
    )


async def tick(svc: Services) -> int:
    """Enqueue a run for every import whose embedding is not done (after a crash, the
    runs that were going are gone). Answers how many."""
    try:
        todo = await svc.run(store.unfinished_embeddings, svc.ch)
        for j in todo:
            await enqueue(svc, j.job_id)
    except Exception as exc:  # the next tick tries again
        log.warning("import embedding tick failed", error=failures.detail(exc))
        return 0
    return len(todo)
