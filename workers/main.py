"""The arq worker process (`loom worker`): runs every background job.

Jobs run concurrently in one event loop (max_jobs), so the embedder can batch the
texts of many concurrent jobs into one model call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from arq.cron import CronJob, cron
from arq.typing import WorkerCoroutine
from arq.worker import Worker
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from loom import lifecycle, redis_calls
from loom import logging as loom_logging
from loom.ops.conversation.lifecycle.titler_tick import TICK_S
from loom.ops.portability.embedding import TICK_S as IMPORT_TICK_S
from loom.queue import QUEUE, RESULTS_KEPT_S, WAKE_KEY
from loom.services import redis_settings
from loom.settings import Settings
from workers import embed_jobs
from workers.context import WorkerContext
from workers.jobs import FUNCTIONS, conversation_titler, import_embed_tick, recover_embeddings

IDLE_POLL_S = 0.1  # a job enqueued without a wake-up waits at most this long
# On SIGTERM/SIGINT the worker takes no new job and gives its running ones this long to
# finish (then cancels them): an append the API is still answering waits on its job.
STOP_WAIT_S = 5
REDIS_RETRY_S = 0.2  # between polls while Redis is away (restarting)

log = loom_logging.get("loom.worker")


class WakeableWorker(Worker):
    """arq's worker, waiting between polls for a wake-up token instead of a fixed delay.

    arq polls its queue (a Redis round trip) every `poll_delay`; at the few
    milliseconds the append path needs (the API awaits the job), an idle worker took
    ~6-9% of a core, and Redis some more: CPU the model then lacks. Here arq's own
    delay is 0 and each poll iteration ends by blocking on WAKE_KEY for up to
    IDLE_POLL_S: a job enqueued with loom.queue.wake_workers() starts at once, any other within
    IDLE_POLL_S (cron jobs and retries too: arq's poll iteration also runs those).
    """

    async def _poll_iteration(self) -> None:
        try:
            await super()._poll_iteration()
            # Redis >= 6 takes the timeout in (fractional) seconds; None back on a timeout.
            await redis_calls.blpop(self.pool, [WAKE_KEY], IDLE_POLL_S)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Redis went away (`loom serve` restarts it on the same socket): keep the
            # running jobs and the loaded model, and poll again once it is back, rather
            # than exit and make the supervisor start a whole new worker process.
            log.warning("redis unreachable; polling again", error=type(exc).__name__)
            await asyncio.sleep(REDIS_RETRY_S)


class _NoJobData(logging.Filter):
    """arq logs every job's arguments and result as their repr (cut at 80 characters):
    for an embedding job, the start of the turns' text. Only the job's name, id and
    timings are kept: no turn's content may reach a log line."""

    START = "%6.2fs → %s(%s)%s"
    RESULT = "%6.2fs ← %s ● %s"
    # The titler's tick runs every few seconds and mostly finds nothing due: its start and
    # end lines would flood the console (a pass that runs logs what it did itself).
    SILENT = ("conversation_titler", "import_embed_tick")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            if (
                record.msg in (self.START, self.RESULT)
                and len(args) >= 2
                and str(args[1]).endswith(self.SILENT)
            ):
                return False
            if record.msg == self.START and len(args) == 4:
                record.args = (args[0], args[1], "…", args[3])
            elif record.msg == self.RESULT and len(args) == 3:
                record.args = (args[0], args[1], "…")
        return True


_ARQ_FILTER = _NoJobData()


def quiet_job_logs() -> None:
    """Keep job arguments and results out of arq's log (idempotent)."""
    logger = logging.getLogger("arq.worker")
    if _ARQ_FILTER not in logger.filters:
        logger.addFilter(_ARQ_FILTER)


def _startup(settings: Settings, clickhouse_url: str, redis_url: str) -> Any:
    async def on_startup(ctx: WorkerContext) -> None:
        ctx["process"] = stack = contextlib.AsyncExitStack()
        ctx["loom"] = await stack.enter_async_context(
            lifecycle.running(settings, clickhouse_url, redis_url, "worker")
        )
        for hook in STARTUP_HOOKS:
            await hook(ctx)
        lifecycle.settle(settings, "worker")

    return on_startup


async def _shutdown(ctx: WorkerContext) -> None:
    for hook in SHUTDOWN_HOOKS:
        await hook(ctx)
    if "process" in ctx:
        await ctx["process"].aclose()


# Planes register per-process resources here (the embedder, write buffers).
STARTUP_HOOKS: list[Any] = [embed_jobs.startup]
SHUTDOWN_HOOKS: list[Any] = [embed_jobs.shutdown]


def every(interval_s: int) -> tuple[set[int], set[int] | None]:
    """arq cron (second, minute) fields for "every `interval_s` seconds", rounded down
    to a divisor of a minute (up to 60 s) or of an hour (above)."""
    if interval_s < 60:
        step = max(d for d in range(1, 61) if 60 % d == 0 and d <= interval_s)
        return set(range(0, 60, step)), None
    minutes = min(60, interval_s // 60)
    step = max(d for d in range(1, 61) if 60 % d == 0 and d <= minutes)
    return {0}, set(range(0, 60, step))


def _arq(job: Callable[[WorkerContext], Awaitable[Any]]) -> WorkerCoroutine:
    """arq annotates a job's ctx as a plain dict; the one it passes is a WorkerContext."""
    return cast(WorkerCoroutine, job)


def cron_jobs(settings: Settings) -> list[CronJob]:
    """The pool's periodic jobs: the embedding recovery pass, also once at start-up
    (each worker enqueues it; its lease lets one run at a time), and the
    conversation_titler's tick, every TICK_S seconds whatever the settings: the tick
    reads the titler's switch and interval live (loom.ops.conversation.lifecycle.titler_tick), so
    an admin's change applies without a restart."""
    second, minute = every(settings.embed_recovery_interval_seconds)
    return [
        cron(
            _arq(recover_embeddings),
            name="recover_embeddings",
            second=second,
            minute=minute,
            run_at_startup=True,
            max_tries=1,
        ),
        cron(_arq(conversation_titler), name="conversation_titler", second=every(TICK_S)[0], max_tries=1),
        cron(_arq(import_embed_tick), name="import_embed_tick", second=every(IMPORT_TICK_S)[0], max_tries=1),
    ]


def build_worker(settings: Settings, clickhouse_url: str, redis_url: str, **overrides: Any) -> Worker:
    options: dict[str, Any] = dict(
        functions=FUNCTIONS,
        cron_jobs=cron_jobs(settings),
        queue_name=QUEUE,
        redis_settings=redis_settings(redis_url),
        on_startup=_startup(settings, clickhouse_url, redis_url),
        on_shutdown=_shutdown,
        max_jobs=256,
        poll_delay=0,  # the wait between polls is WakeableWorker's (woken per job)
        job_timeout=300,
        keep_result=RESULTS_KEPT_S,
        handle_signals=True,
        job_completion_wait=STOP_WAIT_S,
    )
    options.update(overrides)
    quiet_job_logs()
    return WakeableWorker(**options)


def run_worker(settings: Settings, clickhouse_url: str, redis_url: str) -> None:
    loom_logging.configure(settings.log_level, verbose=settings.log_verbose)
    build_worker(settings, clickhouse_url, redis_url).run()
