"""What health.show reads of an arq queue, in arq's own Redis layout (arq 0.2x):

- the queue: a sorted set of job ids scored by the time each may run (ms; the
  enqueue time, or the deferral's end). A job stays in it while it runs; its worker
  removes it when it finishes (or re-scores it for a retry);
- ``arq:in-progress:<job id>``: set by the worker that runs the job;
- ``arq:result:<job id>``: the job's result (pickled by arq, read with arq's own
  ``deserialize_result``), kept ``keep_result`` seconds after it finished; it names
  the job's queue and whether it succeeded.

Every read is bounded, whatever the queue's or the keyspace's size: the due jobs looked
at for "in progress" (DUE_CAP), the keys a result scan walks (SCAN_CALLS x SCAN_COUNT),
the results it looks at (RESULT_CAP) and the bytes of them it reads (RESULT_BYTES: a
result carries its job's arguments, an embedding job's turns among them). A figure cut short by a cap is answered with
``..._at_least`` set: the true figure is that or more.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, result_key_prefix
from arq.jobs import DeserializationError, Deserializer, deserialize_result

DUE_CAP = 1_000  # due jobs read (oldest first) to tell the running from the waiting
SCAN_COUNT = 5_000  # keys a SCAN call walks (about a millisecond of Redis)
SCAN_CALLS = 10  # SCAN calls per request: at most ~50,000 keys walked
RESULT_CAP = 1_000  # results looked at per request
RESULT_BYTES = 4 << 20  # bytes of results read per request (a result holds its job's arguments)


@dataclass(frozen=True)
class QueueState:
    queued: int  # in the queue and not running (deferred ones included)
    deferred: int  # of those, not due yet
    in_progress: int
    in_progress_at_least: bool
    oldest_waiting_s: float | None  # age of the longest-waiting due job that is not running
    failed: int  # results of this queue's jobs that failed, still kept
    succeeded: int  # ... that succeeded
    results_at_least: bool  # the result scan stopped at a cap


@dataclass(frozen=True)
class Results:
    failed: int
    succeeded: int
    at_least: bool


async def queue_state(arq: ArqRedis, queue: str, *, now_ms: int | None = None) -> QueueState:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    pipe = arq.pipeline(transaction=False)
    pipe.zcard(queue)
    pipe.zcount(queue, f"({now}", "+inf")
    pipe.zrangebyscore(queue, "-inf", now, start=0, num=DUE_CAP, withscores=True)
    total, deferred, due = await pipe.execute()
    running = await _running(arq, [job_id for job_id, _ in due])
    waiting = [score for (job_id, score), run in zip(due, running, strict=True) if not run]
    results = await results_of(arq, queue)
    in_progress = sum(running)
    return QueueState(
        queued=max(0, int(total) - in_progress),
        deferred=int(deferred),
        in_progress=in_progress,
        in_progress_at_least=len(due) >= DUE_CAP,
        oldest_waiting_s=max(0.0, (now - min(waiting)) / 1000) if waiting else None,
        failed=results.failed,
        succeeded=results.succeeded,
        results_at_least=results.at_least,
    )


async def _running(arq: ArqRedis, job_ids: list[bytes]) -> list[bool]:
    if not job_ids:
        return []
    pipe = arq.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.exists(in_progress_key_prefix + job_id.decode())
    return [bool(n) for n in await pipe.execute()]


async def results_of(arq: ArqRedis, queue: str) -> Results:
    """The kept results of `queue`'s jobs, by success (a bounded SCAN: see the module)."""
    keys: list[bytes] = []
    cursor, calls = 0, 0
    while calls < SCAN_CALLS and len(keys) < RESULT_CAP:
        cursor, found = await arq.scan(cursor, match=result_key_prefix + "*", count=SCAN_COUNT)
        keys.extend(found)
        calls += 1
        if cursor == 0:
            break
    keys = list(dict.fromkeys(keys))  # a SCAN may return a key twice
    at_least = cursor != 0 or len(keys) > RESULT_CAP
    keys, skipped = await _within_budget(arq, keys[:RESULT_CAP])
    values = await arq.mget(keys) if keys else []
    # Unpickling up to RESULT_BYTES is CPU work: off the event loop that serves the API.
    failed, succeeded = await asyncio.to_thread(_count, values, queue, arq.job_deserializer)
    return Results(failed, succeeded, at_least or skipped)


def _count(values: list[bytes | None], queue: str, deserializer: Deserializer | None) -> tuple[int, int]:
    """(failed, succeeded) among the results of `queue`'s jobs."""
    failed = succeeded = 0
    for data in values:
        if data is None:  # expired since the scan
            continue
        try:
            result = deserialize_result(data, deserializer=deserializer)
        except DeserializationError:  # another build's or another serializer's result
            continue
        if result.queue_name != queue:
            continue
        if result.success:
            succeeded += 1
        else:
            failed += 1
    return failed, succeeded


async def _within_budget(arq: ArqRedis, keys: list[bytes]) -> tuple[list[bytes], bool]:
    """The keys whose values fit in RESULT_BYTES together (their sizes asked first, one
    round trip), and whether any was left out."""
    if not keys:
        return [], False
    pipe = arq.pipeline(transaction=False)
    for key in keys:
        pipe.strlen(key)
    kept: list[bytes] = []
    budget, skipped = RESULT_BYTES, False
    for key, size in zip(keys, await pipe.execute(), strict=True):
        if size and size <= budget:  # 0: expired since the scan
            kept.append(key)
            budget -= size
        elif size:
            skipped = True
    return kept, skipped
