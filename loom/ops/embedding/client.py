"""The API's side of an append's embedding: the insert gate.

An append flush hands the turns it stores that are to be embedded to the worker pool
(:meth:`EmbedClient.embed`: one arq job per flush) *while* its insert runs (the model
call does not need the row: ~20 ms of a ~180 ms round of 32 single-turn appends),
behind an insert gate: the worker writes the vectors only once the API opened the gate
(:func:`open_gate`, after the insert: the rows are durable), and none if the insert
failed (:func:`wait_gate` is the worker's end). The API then awaits the worker's
replies (on its reply channel, :mod:`loom.replies`; a long
job is answered part by part). A turn with no answer within LOOM_EMBED_WAIT_SECONDS
gets the error recorded on its embedding row by the API itself (fail-open,
:func:`record_unanswered`), and the append answers. A turn whose embedding row already
holds a live vector built from the same text (another agent logged the same turn) is
not sent at all: the flush's one read found that row, and the vector is reused (no
model call).

The API's error row carries the version stamped when the job was enqueued, older than
anything the worker writes for that job, so a vector that lands after the API gave up
always wins (see :mod:`loom.ops.embedding.writer`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from loom import failures, jobs, redis_calls, redis_keys
from loom import logging as loom_logging
from loom.clock import next_version
from loom.jobs import EmbedTurn, ReembedItem
from loom.ops.conversation.common import EMBEDDED, FAILED
from loom.ops.embedding.writer import LiveTurn, Outcome, embedding_row, write_live
from loom.replies import Reply, ReplyChannel
from loom.services import Services
from loom.store import embeddings as emb_store

log = loom_logging.get("loom.conversation.embedding")

GATE_TTL_S = 600
_OPEN, _SHUT = b"ok", b"fail"


# -- the gate ---------------------------------------------------------------------


def _gate_keys(gate: str) -> tuple[str, str]:
    return redis_keys.embed_gate(gate), redis_keys.embed_gate_wake(gate)


async def open_gate(redis: Redis, gate: str, *, durable: bool) -> None:
    """The API, after its flush's insert: the rows are durable (or not: no vectors)."""
    key, wake = _gate_keys(gate)
    value = _OPEN if durable else _SHUT
    pipe = redis.pipeline(transaction=False)
    pipe.set(key, value, ex=GATE_TTL_S)  # for a retried job or a late reader
    pipe.rpush(wake, value)  # wakes the one blocked reader
    pipe.expire(wake, GATE_TTL_S)
    await pipe.execute()


async def wait_gate(redis: Redis, gate: str, timeout: float) -> bool:
    """The worker, before writing a gated job's vectors: True once the rows are durable;
    False if the insert failed or no answer came within `timeout` (the API is gone)."""
    key, wake = _gate_keys(gate)
    value = await redis.get(key)
    if value is None:  # not open yet: the wake-up carries the same value as the key
        popped = await redis_calls.blpop(redis, [wake], timeout)
        value = popped[1] if popped is not None else None
    return bool(value == _OPEN)


# -- the API's fail-open write ----------------------------------------------------


async def record_unanswered(
    svc: Services, turns: Sequence[EmbedTurn], version: int, error: str
) -> list[Outcome]:
    """Fail-open for turns whose embedding did not come back in time: under the thread
    leases, write an error row (empty vector; `error` made safe, a code and its fixed
    message) for each turn that is still live and has no vector yet, at `version` (the
    job's enqueue stamp, older than any row the worker writes for the job, so a vector
    that lands later still wins)."""
    error = failures.safe(error)

    def decide(lt: LiveTurn) -> tuple[Outcome, emb_store.EmbeddingRow | None]:
        cur, t = lt.current, lt.turn
        if cur is not None and cur.has_vector and not cur.tombstoned and cur.text == t.text:
            return Outcome(EMBEDDED), None  # the vector landed meanwhile
        if cur is not None and (cur.version >= version or (cur.has_vector and not cur.tombstoned)):
            return Outcome(FAILED, error), None  # the worker recorded it already, or a live vector stays
        row = embedding_row(t, lt.state, vector=None, model="", error=error, version=version)
        return Outcome(FAILED, error), row

    return await write_live(svc, turns, decide, lambda idxs: f"unanswered-{version}-{idxs[0]}")


# -- the client ------------------------------------------------------------------


@dataclass
class _Job:
    turns: Sequence[EmbedTurn]
    version: int
    futures: list[asyncio.Future[Outcome]]
    gate: str | None = None


class EmbedClient:
    """Per API process: enqueues embedding jobs and awaits the workers' replies.

    The replies of all of the process's jobs arrive on its reply channel (one blocking
    read at a time, no polling). A job's turns are answered part by part, as the
    worker writes them."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.replies = ReplyChannel(svc, on_job=self._on_reply)
        self._jobs: dict[str, _Job] = {}
        self._watchdogs: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        for task in list(self._watchdogs):
            task.cancel()
        await self.replies.close()
        self._jobs.clear()

    def _on_reply(self, job_id: str, msg: Reply) -> bool:
        """A reply for one of this client's embedding jobs: answer its turns."""
        job = self._jobs.get(job_id)
        if job is None:
            return False
        if msg.part is not None:
            for j, (status, error) in enumerate(msg.outcomes or []):
                turn_future = job.futures[msg.part + j]
                if not turn_future.done():
                    turn_future.set_result(Outcome(status, failures.safe(error) if error else ""))
        elif msg.error is not None:  # the job failed as a whole: fail open for what is left
            self._spawn(self._fail_open(job_id, failures.safe(msg.error)))
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._watchdogs.add(task)
        task.add_done_callback(self._watchdogs.discard)

    def embed(self, turns: Sequence[EmbedTurn], *, gate: str | None = None) -> list[asyncio.Future[Outcome]]:
        """One job for `turns`; a future per turn, each answered within
        LOOM_EMBED_WAIT_SECONDS (fail-open: what is unanswered then gets its error
        recorded on its embedding row). With a `gate`, the worker writes nothing
        before :func:`open_gate` opened it."""
        self.replies.listening()
        loop = asyncio.get_running_loop()
        job_id = uuid.uuid4().hex
        job = _Job(
            turns, next_version(), [loop.create_future() for _ in turns], gate
        )  # older than any worker write
        self._jobs[job_id] = job
        self._spawn(self._run_job(job_id, job))
        return job.futures

    async def _run_job(self, job_id: str, job: _Job) -> None:
        try:
            await self._await_job(job_id, job)
        finally:  # however it ended (a failed enqueue too): the job and its texts are let go
            self._jobs.pop(job_id, None)

    async def _await_job(self, job_id: str, job: _Job) -> None:
        wait = self.svc.settings.embed_wait_seconds
        try:
            # "at": the enqueue stamp, from which the worker's write deadline runs.
            await self.replies.enqueue(
                jobs.EmbedTurnsJob, job_id, wait, turns=list(job.turns), at=job.version, gate=job.gate
            )
        except Exception as exc:
            log.warning("could not enqueue an embedding job", error=failures.detail(exc))
            await self._fail_open(job_id, failures.failure(exc))
            return
        _, pending = await asyncio.wait(job.futures, timeout=wait)
        if pending:
            await self._fail_open(job_id, failures.text(failures.EMBEDDER_TIMEOUT))

    async def _fail_open(self, job_id: str, error: str) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        idxs = [i for i, f in enumerate(job.futures) if not f.done()]
        if not idxs:
            return
        try:
            outcomes = await record_unanswered(self.svc, [job.turns[i] for i in idxs], job.version, error)
        except Exception as exc:
            log.error("could not record the embedding error", error=failures.detail(exc))
            outcomes = [Outcome(FAILED, failures.safe(error))] * len(idxs)
        for i, outcome in zip(idxs, outcomes, strict=True):
            if not job.futures[i].done():
                job.futures[i].set_result(outcome)

    async def reembed(self, items: Sequence[ReembedItem], timeout: float) -> dict[str, int]:
        msg = await self.replies.call(jobs.ReembedRowsJob, timeout, rows=list(items))
        return dict(msg.counts or {})
