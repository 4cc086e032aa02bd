"""The job queue the API and the workers share: its name and its wake-up signal.

Both sides import it from here, so the API (which enqueues and awaits jobs) needs no
import of the worker package, and the worker (workers/main.py) blocks on the same key
the enqueuer pushes to.
"""

from __future__ import annotations

from redis.asyncio import Redis

from loom import redis_keys

QUEUE = redis_keys.QUEUE
# A job's enqueuer pushes a token here (see wake_workers); an idle worker blocks on it
# instead of polling the queue every few milliseconds.
WAKE_KEY = redis_keys.QUEUE_WAKE
WAKE_TTL_S = 60
# How long arq keeps a finished job's result (the worker's keep_result): health.show
# counts the failed jobs of that last stretch.
RESULTS_KEPT_S = 60


async def wake_workers(redis: Redis) -> None:
    """Tell an idle worker that a job was just enqueued (one round trip)."""
    pipe = redis.pipeline(transaction=False)
    pipe.rpush(WAKE_KEY, b"1")
    pipe.expire(WAKE_KEY, WAKE_TTL_S)  # no worker running: the tokens do not pile up
    await pipe.execute()
