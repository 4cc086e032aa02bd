"""Embedding the turns an append stored, and re-embedding rows after a model change.

Who does what:

* The API (:class:`EmbedClient`): a flush enqueues one arq job for every turn it stores
  that is to be embedded, *while* its insert runs (the model call does not need the
  row: ~20 ms of a ~180 ms round of 32 single-turn appends), behind an insert gate: the
  worker writes the vectors only once the API opened the gate (:func:`open_gate`: the
  rows are durable), and none if the insert failed. It awaits the worker's
  replies (pushed onto a per-process Redis list, so waiting costs one blocking read per
  process, not a poll per job; a long job is answered part by part). A turn with no
  answer within LOOM_EMBED_WAIT_SECONDS gets the error recorded on its embedding row
  by the API itself (fail-open), and the append answers.
  A turn whose embedding row already holds a live vector built from the same text
  (another agent logged the same turn) is not sent at all: the flush's one read found
  that row, and the vector is reused (no model call).
* The worker (:class:`EmbedPipeline`, one per worker process): hands the texts to the
  model micro-batcher (which merges concurrent jobs' texts into model calls), and
  writes the vectors in batches, under the thread leases, taken only after the model
  call. Under the lease it re-reads the transcript rows: a turn tombstoned meanwhile
  gets no late vector ("deleted"); a turn saved meanwhile passes its is_saved/saved_at
  and owner (a save claims an unowned row) to its embedding row; a live vector another
  agent's copy wrote meanwhile is never overwritten by an error.

The recovery pass (:mod:`loom.ops.conversation.recovery`) embeds turns that landed with
no embedding row at all once they are older than its grace. So that it and a late job
never both write one turn, a job's vectors are written only while the job is younger
than that grace less RECOVERY_CLOCK_MARGIN_S (checked under the thread lease, which
the pass holds too); past it, the job's turns are left to the pass (or to the error
row the API wrote when its own wait ran out).

Version ordering: the worker stamps its rows with the clock when it writes. The API's
timeout row carries the version stamped when the job was enqueued, which is older than
anything the worker can write for that job, so a vector that lands after the API gave
up always wins over the API's error row, whichever insert reaches ClickHouse first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import numpy as np
from redis.asyncio import Redis

from loom import failures, jobs, redis_keys
from loom import logging as loom_logging
from loom.clock import next_version
from loom.jobs import EmbedTurn as EmbedTurn  # re-exported: callers import it from here
from loom.jobs import ReembedItem as ReembedItem
from loom.ops.conversation.common import DELETED, EMBEDDED, FAILED, skipped
from loom.ops.conversation.leases import under_thread_leases
from loom.queue import QUEUE, wake_workers
from loom.services import Services
from loom.settings import Settings
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import search_marks
from loom.store.write_buffer import Batcher

log = loom_logging.get("loom.conversation.embedding")

REPLY_TTL_S = 300
GATE_TTL_S = 600
RECOVERY_CLOCK_MARGIN_S = 5.0  # clock skew between API, worker and store hosts, with room to spare
_OPEN, _SHUT = b"ok", b"fail"


# -- the insert gate --------------------------------------------------------------


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
        popped = await redis.blpop([wake], timeout=timeout)  # type: ignore[misc, arg-type]
        value = popped[1] if popped is not None else None
    return bool(value == _OPEN)


@dataclass(frozen=True)
class Outcome:
    status: str  # "embedded" | "skipped:deleted" | "failed"
    error: str = ""


@dataclass
class ModelResult:
    """Per text: a vector, or the error that kept it from one."""

    vectors: list[np.ndarray | None]
    errors: list[str]
    model_id: str


ModelFn = Callable[[list[str]], Awaitable[ModelResult]]
PartFn = Callable[[int, list["Outcome"]], Awaitable[None]]  # (index of the part's first turn, outcomes)


def model_from_embedder(get_embedder: Callable[[], Any], executor: Executor | None = None) -> ModelFn:
    """A model function calling an embedder directly (no batching across callers):
    for the `loom reembed` CLI, which embeds in its own process."""

    async def run(texts: list[str]) -> ModelResult:
        embedder = get_embedder()
        try:
            vectors = await asyncio.get_running_loop().run_in_executor(executor, embedder.embed, texts)
        except Exception as exc:
            log.warning("embedding call failed", error=failures.detail(exc, sent=texts), texts=len(texts))
            msg = failures.embed_failure(exc)
            return ModelResult([None] * len(texts), [msg] * len(texts), embedder.model_id)
        return ModelResult(list(vectors), [""] * len(texts), embedder.model_id)

    return run


# -- the worker side ------------------------------------------------------------


@dataclass
class _Write:
    turn: EmbedTurn
    vector: np.ndarray | None = None
    model: str = ""
    error: str = ""
    not_after_ns: int = 0  # written only up to this wall-clock time (0: no limit)


def write_deadline_ns(settings: Settings, enqueued_ns: int) -> int:
    """Until when the vectors of a job enqueued at `enqueued_ns` may be written: past
    it, the recovery pass may have embedded its turns."""
    return enqueued_ns + int((settings.recovery_grace_seconds - RECOVERY_CLOCK_MARGIN_S) * 1e9)


@dataclass
class _Reembed:
    item: ReembedItem
    vector: np.ndarray | None
    model: str
    error: str


class EmbedPipeline:
    """Per worker process: model call, then vector write, each batched across the
    concurrent jobs of the process."""

    def __init__(self, svc: Services, model: ModelFn) -> None:
        self.svc = svc
        self.model = model
        self._writes: Batcher[_Write, Outcome] = Batcher(
            self._write_flush, max_items=5_000, max_wait_s=0.001, max_inflight=4, name="embed-write"
        )

    async def close(self) -> None:
        await self._writes.close()

    async def embed_turns(
        self,
        turns: Sequence[EmbedTurn],
        *,
        chunk: int = 256,
        on_part: PartFn | None = None,
        gate: Awaitable[bool] | None = None,
        not_after_ns: int = 0,
    ) -> list[Outcome]:
        """Embed and write `turns` in chunks of `chunk`, all queued at once: each chunk
        is written (and reported through `on_part`) as soon as its own model call is
        done, so the first turns of a job are answered while the rest still compute.
        With a `gate`, nothing is written before it says the turns' rows are durable,
        and nothing at all if it says they are not (their outcome: deleted). Nothing is
        written past `not_after_ns` (:func:`write_deadline_ns`; 0: no limit)."""
        gated = asyncio.ensure_future(gate) if gate is not None else None

        async def one(lo: int) -> list[Outcome]:
            part = turns[lo : lo + chunk]
            result = await self.model([t.text for t in part])
            if gated is not None and not await asyncio.shield(gated):
                outcomes = [Outcome(skipped(DELETED))] * len(part)
                if on_part is not None:
                    await on_part(lo, outcomes)
                return outcomes
            outcomes = await self._writes.submit_many(
                [
                    _Write(t, result.vectors[j], result.model_id, result.errors[j], not_after_ns)
                    for j, t in enumerate(part)
                ]
            )
            if on_part is not None:
                await on_part(lo, outcomes)
            return outcomes

        try:
            parts = await asyncio.gather(*(one(lo) for lo in range(0, len(turns), chunk)))
        finally:
            if gated is not None and not gated.done():
                gated.cancel()  # a failed job leaves no reader blocked on Redis
        return [o for part in parts for o in part]

    async def _write_flush(self, items: list[_Write]) -> list[Outcome]:
        results: dict[int, Outcome] = {}
        by_pair: dict[tuple[str, str], list[int]] = {}
        for i, w in enumerate(items):
            by_pair.setdefault((w.turn.namespace, w.turn.thread_id), []).append(i)

        async def work(held: set[tuple[str, str]]) -> None:
            idxs = [i for p in held for i in by_pair[p]]
            results.update(await self.svc.run(self._write_sync, [(i, items[i]) for i in idxs]))

        await under_thread_leases(self.svc.redis, by_pair, work)
        return [results[i] for i in range(len(items))]

    def _write_sync(self, batch: list[tuple[int, _Write]]) -> dict[int, Outcome]:
        """Under the leases: re-read the transcript rows, then one insert."""
        ch = self.svc.ch
        turns = conv_store.states(ch, [w.turn.turn_key for _, w in batch])
        failing = [w.turn.emb_key for _, w in batch if w.error]
        current = emb_store.states(ch, failing) if failing else {}
        rows: dict[emb_store.EmbKey, emb_store.EmbeddingRow] = {}
        out: dict[int, Outcome] = {}
        now = time.time_ns()
        for i, w in batch:
            t = w.turn
            st = turns.get(t.turn_key)
            if st is None or st.tombstoned:
                out[i] = Outcome(skipped(DELETED))  # removed while its embedding ran: no late vector
                continue
            if w.not_after_ns and now > w.not_after_ns:
                # Too late: the recovery pass may have embedded the turn (under this lease).
                out[i] = Outcome(FAILED, failures.text(failures.EMBEDDER_TIMEOUT))
                continue
            if w.error:
                cur = current.get(t.emb_key)
                if cur is not None and cur.has_vector and not cur.tombstoned:
                    # A live vector is already there (another agent's copy): never clobber it.
                    out[i] = (
                        Outcome(EMBEDDED) if cur.text == t.text else Outcome(FAILED, failures.safe(w.error))
                    )
                    continue
                out[i] = Outcome(FAILED, failures.safe(w.error))
            else:
                out[i] = Outcome(EMBEDDED)
            rows[t.emb_key] = emb_store.EmbeddingRow(
                namespace=t.namespace,
                thread_id=t.thread_id,
                msg_id=t.msg_id,
                agent=t.agent,
                role=t.role,
                run_id=t.run_id,
                user_id=st.user_id,
                ts=t.ts,
                text=t.text,
                embedding=w.vector if w.vector is not None and not w.error else [],
                model=w.model,
                error=failures.safe(w.error) if w.error else "",
                is_summary=t.is_summary,
                is_saved=st.is_saved,
                saved_at=st.saved_at,
                tombstoned=False,
                version=next_version(),
                origin=st.origin,
            )
        if rows:
            emb_store.insert(ch, list(rows.values()), dedup_token=uuid.uuid4().hex)
        return out

    # -- re-embedding --------------------------------------------------------

    async def reembed(self, items: Sequence[ReembedItem]) -> dict[str, int]:
        return await reembed_items(self.svc, self.model, items)


async def reembed_items(svc: Services, model: ModelFn, items: Sequence[ReembedItem]) -> dict[str, int]:
    """Embed each item's kept text and write the vectors (see write_reembedded)."""
    result = await model([it.text for it in items])
    done = [_Reembed(it, result.vectors[j], result.model_id, result.errors[j]) for j, it in enumerate(items)]
    return await write_reembedded(svc, done)


async def write_reembedded(svc: Services, done: Sequence[_Reembed]) -> dict[str, int]:
    """Write re-embedded vectors under the thread leases, re-checking each row first: a
    row tombstoned or rewritten (another text) meanwhile is left as it is."""
    counts = {"reembedded": 0, "skipped_tombstoned": 0, "skipped_changed": 0, "failed": 0}
    by_pair: dict[tuple[str, str], list[_Reembed]] = {}
    for d in done:
        by_pair.setdefault((d.item.namespace, d.item.thread_id), []).append(d)

    def write(batch: list[_Reembed]) -> dict[str, int]:
        current = emb_store.rows(svc.ch, [d.item.key for d in batch])
        local = dict.fromkeys(counts, 0)
        rows = []
        for d in batch:
            row = current.get(d.item.key)
            if row is None or row.tombstoned:
                local["skipped_tombstoned"] += 1
            elif row.text != d.item.text:
                local["skipped_changed"] += 1
            elif d.error or d.vector is None:
                local["failed"] += 1
            else:
                rows.append(replace(row, embedding=d.vector, model=d.model, error="", version=next_version()))
                local["reembedded"] += 1
        if rows:
            emb_store.insert(svc.ch, rows, dedup_token=uuid.uuid4().hex)
        return local

    async def work(held: set[tuple[str, str]]) -> None:
        local = await svc.run(write, [d for p in held for d in by_pair[p]])
        for k, v in local.items():
            counts[k] += v

    # New versions of existing rows: search must verify the old vectors it still holds.
    async with search_marks.changing(svc.redis, svc.ch, svc.run, sorted(by_pair)):
        await under_thread_leases(svc.redis, by_pair, work)
    return counts


# -- the API side ---------------------------------------------------------------


async def record_unanswered(
    svc: Services, turns: Sequence[EmbedTurn], version: int, error: str
) -> list[Outcome]:
    """Fail-open for turns whose embedding did not come back in time: under the thread
    leases, write an error row (empty vector; `error` made safe, a code and its fixed
    message) for each turn that is still live and has no vector yet, at `version` (the
    job's enqueue stamp, older than any row the worker writes for the job, so a vector
    that lands later still wins)."""
    error = failures.safe(error)

    def write(idxs: list[int]) -> dict[int, Outcome]:
        batch = [turns[i] for i in idxs]
        live = conv_store.states(svc.ch, [t.turn_key for t in batch])
        current = emb_store.states(svc.ch, [t.emb_key for t in batch])
        rows: dict[emb_store.EmbKey, emb_store.EmbeddingRow] = {}
        local: dict[int, Outcome] = {}
        for i, t in zip(idxs, batch, strict=True):
            st = live.get(t.turn_key)
            cur = current.get(t.emb_key)
            if st is None or st.tombstoned:
                local[i] = Outcome(skipped(DELETED))
            elif cur is not None and cur.has_vector and not cur.tombstoned and cur.text == t.text:
                local[i] = Outcome(EMBEDDED)  # the vector landed meanwhile
            elif cur is not None and (cur.version >= version or (cur.has_vector and not cur.tombstoned)):
                local[i] = Outcome(FAILED, error)  # the worker recorded it already, or a live vector stays
            else:
                local[i] = Outcome(FAILED, error)
                rows[t.emb_key] = emb_store.EmbeddingRow(
                    namespace=t.namespace,
                    thread_id=t.thread_id,
                    msg_id=t.msg_id,
                    agent=t.agent,
                    role=t.role,
                    run_id=t.run_id,
                    user_id=st.user_id,
                    ts=t.ts,
                    text=t.text,
                    embedding=[],
                    model="",
                    error=error,
                    is_summary=t.is_summary,
                    is_saved=st.is_saved,
                    saved_at=st.saved_at,
                    tombstoned=False,
                    version=version,
                    origin=st.origin,
                )
        if rows:
            emb_store.insert(svc.ch, list(rows.values()), dedup_token=f"unanswered-{version}-{idxs[0]}")
        return local

    return await _write_under_leases(svc, turns, write)


async def _write_under_leases(
    svc: Services, turns: Sequence[EmbedTurn], write: Callable[[list[int]], dict[int, Outcome]]
) -> list[Outcome]:
    """Run `write` (blocking, on the store's thread pool) for the indexes of `turns`
    whose threads' leases are held, thread by thread, and answer one outcome per turn."""
    out: dict[int, Outcome] = {}
    by_pair: dict[tuple[str, str], list[int]] = {}
    for i, t in enumerate(turns):
        by_pair.setdefault((t.namespace, t.thread_id), []).append(i)

    async def work(held: set[tuple[str, str]]) -> None:
        out.update(await svc.run(write, [i for p in held for i in by_pair[p]]))

    await under_thread_leases(svc.redis, by_pair, work)
    return [out[i] for i in range(len(turns))]


PRESENT = "present"  # the recovery pass found an embedding row in place: nothing written


async def write_recovered(svc: Services, turns: Sequence[EmbedTurn], result: ModelResult) -> list[Outcome]:
    """The recovery pass's write (loom.ops.conversation.recovery), after its model call:
    under the thread leases, for each turn still live that has no embedding row at all,
    a row with its vector, or with its error (fail-open, as an append's embed). A row
    that landed meanwhile (a late append job, a save, another pass) is kept as it is:
    the pass never writes over an embedding row, so it needs no search marks."""

    def write(idxs: list[int]) -> dict[int, Outcome]:
        batch = [turns[i] for i in idxs]
        live = conv_store.states(svc.ch, [t.turn_key for t in batch])
        current = emb_store.states(svc.ch, [t.emb_key for t in batch])
        rows: dict[emb_store.EmbKey, emb_store.EmbeddingRow] = {}
        local: dict[int, Outcome] = {}
        for i, t in zip(idxs, batch, strict=True):
            st = live.get(t.turn_key)
            if st is None or st.tombstoned:
                local[i] = Outcome(skipped(DELETED))
                continue
            if t.emb_key in current or t.emb_key in rows:
                local[i] = Outcome(skipped(PRESENT))
                continue
            vector, error = result.vectors[i], result.errors[i]
            if error or vector is None:
                local[i] = Outcome(FAILED, failures.safe(error))
                vector = None
            else:
                local[i] = Outcome(EMBEDDED)
            rows[t.emb_key] = emb_store.EmbeddingRow(
                namespace=t.namespace,
                thread_id=t.thread_id,
                msg_id=t.msg_id,
                agent=t.agent,
                role=t.role,
                run_id=t.run_id,
                user_id=st.user_id,
                ts=t.ts,
                text=t.text,
                embedding=vector if vector is not None else [],
                model=result.model_id if vector is not None else "",
                error=local[i].error,
                is_summary=t.is_summary,
                is_saved=st.is_saved,
                saved_at=st.saved_at,
                tombstoned=False,
                version=next_version(),
                origin=st.origin,
            )
        if rows:
            emb_store.insert(svc.ch, list(rows.values()), dedup_token=f"recovered-{uuid.uuid4().hex}")
        return local

    return await _write_under_leases(svc, turns, write)


class JobFailed(RuntimeError):
    pass


@dataclass
class _Job:
    turns: Sequence[EmbedTurn]
    version: int
    futures: list[asyncio.Future[Outcome]]
    gate: str | None = None


class EmbedClient:
    """Per API process: enqueues embedding jobs and awaits the workers' replies.

    The replies of all of the process's jobs arrive on one Redis list (one blocking
    read at a time, no polling). A job's turns are answered part by part, as the
    worker writes them."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.reply_key = redis_keys.reply(uuid.uuid4().hex)
        self._calls: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._jobs: dict[str, _Job] = {}
        self._listener: asyncio.Task[None] | None = None
        self._watchdogs: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        for task in list(self._watchdogs):
            task.cancel()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        for fut in self._calls.values():
            if not fut.done():
                fut.cancel()
        self._calls.clear()
        self._jobs.clear()

    def _listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="embed-replies")

    async def _listen(self) -> None:
        while True:
            try:
                item = await self.svc.redis.blpop([self.reply_key], timeout=1)  # type: ignore[misc]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away for a moment: keep listening
                log.warning("embed reply listener error", error=failures.detail(exc))
                await asyncio.sleep(0.2)
                continue
            if item is None:
                continue
            try:
                msg = json.loads(item[1])
            except ValueError:
                continue
            job_id = str(msg.get("job", ""))
            job = self._jobs.get(job_id)
            if job is not None:
                if "part" in msg:
                    lo = int(msg["part"])
                    for j, (status, error) in enumerate(msg["outcomes"]):
                        turn_future = job.futures[lo + j]
                        if not turn_future.done():
                            turn_future.set_result(
                                Outcome(str(status), failures.safe(str(error)) if error else "")
                            )
                elif "error" in msg:  # the job failed as a whole: fail open for what is left
                    self._spawn(self._fail_open(job_id, failures.safe(str(msg["error"]))))
                continue
            fut = self._calls.pop(job_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._watchdogs.add(task)
        task.add_done_callback(self._watchdogs.discard)

    async def _enqueue(self, model: type[jobs.Replied], job_id: str, timeout: float, **fields: Any) -> None:
        payload = jobs.build(model, job=job_id, reply=self.reply_key, **fields)
        job = await self.svc.arq.enqueue_job(
            model.JOB,
            payload,
            _job_id=job_id,
            _queue_name=QUEUE,
            _expires=timedelta(seconds=max(600.0, timeout * 4)),
        )
        if job is None:
            raise JobFailed(f"job {job_id} was not enqueued")
        await wake_workers(self.svc.redis)  # the API awaits it: no poll interval in between

    async def call(self, model: type[jobs.Replied], timeout: float, **fields: Any) -> dict[str, Any]:
        """Enqueue the job `model` with `fields` and await its one reply; TimeoutError after `timeout` s."""
        self._listening()
        job_id = uuid.uuid4().hex
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[job_id] = fut
        try:
            await self._enqueue(model, job_id, timeout, **fields)
            msg = await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self._calls.pop(job_id, None)
        if "error" in msg:
            raise JobFailed(failures.safe(str(msg["error"])))
        return msg

    def embed(self, turns: Sequence[EmbedTurn], *, gate: str | None = None) -> list[asyncio.Future[Outcome]]:
        """One job for `turns`; a future per turn, each answered within
        LOOM_EMBED_WAIT_SECONDS (fail-open: what is unanswered then gets its error
        recorded on its embedding row). With a `gate`, the worker writes nothing
        before :func:`open_gate` opened it."""
        self._listening()
        loop = asyncio.get_running_loop()
        job_id = uuid.uuid4().hex
        job = _Job(
            turns, next_version(), [loop.create_future() for _ in turns], gate
        )  # older than any worker write
        self._jobs[job_id] = job
        self._spawn(self._run_job(job_id, job))
        return job.futures

    async def _run_job(self, job_id: str, job: _Job) -> None:
        wait = self.svc.settings.embed_wait_seconds
        try:
            # "at": the enqueue stamp, from which the worker's write deadline runs.
            await self._enqueue(
                jobs.EmbedTurnsJob, job_id, wait, turns=list(job.turns), at=job.version, gate=job.gate
            )
        except Exception as exc:
            log.warning("could not enqueue an embedding job", error=failures.detail(exc))
            await self._fail_open(job_id, failures.failure(exc))
            return
        _, pending = await asyncio.wait(job.futures, timeout=wait)
        if pending:
            await self._fail_open(job_id, failures.text(failures.EMBEDDER_TIMEOUT))
        self._jobs.pop(job_id, None)

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
        msg = await self.call(jobs.ReembedRowsJob, timeout, rows=list(items))
        return {k: int(v) for k, v in msg["counts"].items()}


async def push_reply(svc: Services, key: str, msg: dict[str, Any]) -> None:
    pipe = svc.redis.pipeline(transaction=False)
    pipe.rpush(key, json.dumps(msg))
    pipe.expire(key, REPLY_TTL_S)
    await pipe.execute()
