"""The bound on compactions doing store work at once in one worker process, and their pace.

Compactions share the worker (event loop, I/O threads) and the engine with the appends'
embedding jobs. Unbounded, a burst of 32 stalled appends for over a second (append p99
12.7x its value alone, bench/studies/compaction.py). At most LOOM_COMPACT_CONCURRENCY of
them read a window or retire one at a time; and after a step that took t seconds the
gate stays shut for LOOM_COMPACT_PACE x t more, so a queue of compactions keeps the
engine busy at most 1 / (1 + pace) of the time and the appends in between find it free.
The rest is charged to the next compaction in the queue: a lone compaction, or the
first of a burst, is never slowed by it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class CompactionGate:
    """`async with gate:` around each store step of a compaction."""

    def __init__(self, concurrency: int, pace: float) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._pace = pace
        self._open_at = 0.0  # loop time before which no step starts
        self._started: dict[asyncio.Task[object] | None, float] = {}

    async def __aenter__(self) -> None:
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        try:
            wait = self._open_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        except BaseException:
            self._slots.release()
            raise
        self._started[asyncio.current_task()] = loop.time()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        now = asyncio.get_running_loop().time()
        started = self._started.pop(asyncio.current_task(), now)
        self._open_at = max(self._open_at, now + (now - started) * self._pace)
        self._slots.release()
