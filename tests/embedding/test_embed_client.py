"""The API's embedding client keeps nothing of a job once it ended (a long-running API
must not grow with the jobs it sent): answered, timed out, or never enqueued."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from loom.jobs import EmbedTurn
from loom.ops.embedding.client import EmbedClient


async def test_a_job_whose_enqueue_failed_is_let_go(services, ns, monkeypatch):
    client = EmbedClient(services)

    async def redis_away(*args, **kwargs):
        raise ConnectionError("redis went away")

    monkeypatch.setattr(client.replies, "enqueue", redis_away)
    turn = EmbedTurn(ns, "default", "t", "m1", "user", "", "", datetime.now(UTC), "a turn")
    [future] = client.embed([turn])
    outcome = await asyncio.wait_for(future, 10)
    assert outcome.status  # answered (fail-open: no row was written for it)
    for _ in range(100):  # the job's task ends just after it answered
        if not client._jobs:
            break
        await asyncio.sleep(0.01)
    assert client._jobs == {}
    await client.close()
