"""The worker waits for wake-ups between polls (workers/main.py: WakeableWorker)."""

from __future__ import annotations

import uuid

from loom.queue import QUEUE, WAKE_KEY, wake_workers
from workers.main import WakeableWorker


async def _ping(services, wake: bool) -> str:
    job = await services.arq.enqueue_job("ping", _job_id=uuid.uuid4().hex, _queue_name=QUEUE)
    assert job is not None
    if wake:
        await wake_workers(services.redis)
    return str(await job.result(timeout=5, poll_delay=0.01))


async def test_a_woken_worker_and_an_unwoken_one_both_run_the_job(services, arq_worker):
    assert isinstance(arq_worker, WakeableWorker)
    assert await _ping(services, wake=True) == "pong"
    assert await _ping(services, wake=False) == "pong"  # picked up by the idle poll
    assert await services.redis.ttl(WAKE_KEY) in (-2, *range(1, 61))  # tokens expire
