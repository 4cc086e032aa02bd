"""The API's reply channel: how an API process learns that a worker finished its job.

Every job an API process awaits names the process's own Redis list (its reply key);
the worker pushes its answer there (:func:`push_reply`, the worker's end) and one
listener per API process pops them (:class:`ReplyChannel`): waiting costs one blocking
read per process, not a poll per job. A job answered once (a re-embed) resolves the
future :meth:`ReplyChannel.call` awaits; a job answered part by part (an append's
embedding job) is handed to the `on_job` callback of its owner
(:class:`loom.ops.embedding.client.EmbedClient`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from loom import failures, jobs, redis_calls, redis_keys
from loom import logging as loom_logging
from loom.queue import QUEUE, wake_workers
from loom.services import Services

log = loom_logging.get("loom.conversation.embedding")

REPLY_TTL_S = 300


class Reply(BaseModel):
    """A worker's answer to a job an API process awaits: one JSON object on the reply
    list (the fields not given are left out of it)."""

    job: str = ""  # the job's id
    part: int | None = None  # an embedding job's part: the index of its first turn
    outcomes: list[tuple[str, str]] | None = None  # per turn: its status and error code
    counts: dict[str, int] | None = None  # a re-embed's counts
    error: str | None = None  # the job failed as a whole: the failure code

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# (job id, reply) -> True when the reply was for one of the owner's jobs.
JobReplyFn = Callable[[str, Reply], bool]


class JobFailed(RuntimeError):
    pass


class ReplyChannel:
    """Per API process: enqueues jobs naming its reply list and listens on that list."""

    def __init__(self, svc: Services, on_job: JobReplyFn | None = None) -> None:
        self.svc = svc
        self.key = redis_keys.reply(uuid.uuid4().hex)
        self._on_job = on_job
        self._calls: dict[str, asyncio.Future[Reply]] = {}
        self._listener: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        for fut in self._calls.values():
            if not fut.done():
                fut.cancel()
        self._calls.clear()

    def listening(self) -> None:
        """Start the listener (once per process, again after it stopped)."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="embed-replies")

    async def _listen(self) -> None:
        while True:
            try:
                item = await redis_calls.blpop(self.svc.redis, [self.key], 1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away for a moment: keep listening
                log.warning("embed reply listener error", error=failures.detail(exc))
                await asyncio.sleep(0.2)
                continue
            if item is None:
                continue
            try:
                msg = Reply.model_validate_json(item[1])
            except ValidationError:
                continue
            job_id = msg.job
            if self._on_job is not None and self._on_job(job_id, msg):
                continue
            fut = self._calls.pop(job_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def enqueue(self, model: type[jobs.Replied], job_id: str, timeout: float, **fields: Any) -> None:
        """Enqueue the job `model` with `fields`, answered on this channel, and wake the
        workers (the API awaits it: no poll interval in between)."""
        payload = jobs.build(model, job=job_id, reply=self.key, **fields)
        job = await self.svc.arq.enqueue_job(
            model.JOB,
            payload,
            _job_id=job_id,
            _queue_name=QUEUE,
            _expires=timedelta(seconds=max(600.0, timeout * 4)),
        )
        if job is None:
            raise JobFailed(f"job {job_id} was not enqueued")
        await wake_workers(self.svc.redis)

    async def call(self, model: type[jobs.Replied], timeout: float, **fields: Any) -> Reply:
        """Enqueue the job `model` with `fields` and await its one reply; TimeoutError after `timeout` s."""
        self.listening()
        job_id = uuid.uuid4().hex
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._calls[job_id] = fut
        try:
            await self.enqueue(model, job_id, timeout, **fields)
            msg = await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self._calls.pop(job_id, None)
        if msg.error is not None:
            raise JobFailed(failures.safe(msg.error))
        return msg


async def push_reply(svc: Services, key: str, reply: Reply) -> None:
    """The worker's end: answer a job on the reply list its payload names."""
    pipe = svc.redis.pipeline(transaction=False)
    pipe.rpush(key, json.dumps(reply.as_json()))
    pipe.expire(key, REPLY_TTL_S)
    await pipe.execute()
