"""An in-process batcher: concurrent callers' items are flushed together.

A one-row ClickHouse insert costs the engine 7-10 ms (a new part per insert), so every
hot write path goes through one of these: items from concurrent requests are collected
and handed to a flush function as one list, by size (``max_items``) or age
(``max_wait_s`` after the first item arrived), whichever comes first; with ``quiet_s``,
also as soon as no item arrived for that long (the burst of concurrent callers is over:
waiting out the rest of ``max_wait_s`` would only add latency). Each caller is
answered with its own item's result only when the flush of its batch returned, so "the
append answered" means "its row is durable".

Several flushes may be in flight at once (``max_inflight``): while one batch waits on
the engine, the next one fills. A flush that raises fails every item of its batch with
that exception; the callers decide what that means.

The batcher is per process and per event loop; it holds no data across a restart
(nothing is acknowledged before its flush returned, so nothing acknowledged is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

FlushFn = Callable[[list[T]], Awaitable[Sequence[R]]]


@dataclass
class _Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]


class BatcherClosed(RuntimeError):
    pass


class Batcher(Generic[T, R]):
    """Collects items and flushes them in batches; see the module docstring."""

    def __init__(
        self,
        flush: FlushFn[T, R],
        *,
        max_items: int,
        max_wait_s: float,
        max_inflight: int = 4,
        quiet_s: float | None = None,
        name: str = "batcher",
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self._flush = flush
        self.max_items = max_items
        self.max_wait_s = max(0.0, max_wait_s)
        self.quiet_s = None if quiet_s is None else max(0.0, quiet_s)
        self.name = name
        self._pending: list[_Pending[T, R]] = []
        self._first_at = 0.0
        self._last_at = 0.0
        self._arrived = asyncio.Event()
        self._wake = asyncio.Event()  # full, closed, or (with quiet_s) any arrival
        self._slots = asyncio.Semaphore(max_inflight)
        self._inflight: set[asyncio.Task[None]] = set()
        self._closed = False
        self._loop_task: asyncio.Task[None] | None = None
        # Figures for benchmarks and metrics.
        self.flushes = 0
        self.flushed_items = 0

    # -- callers -------------------------------------------------------------

    async def submit(self, item: T) -> R:
        return (await self.submit_many([item]))[0]

    async def submit_many(self, items: Sequence[T]) -> list[R]:
        """Queue ``items`` (kept in order, possibly split over several flushes) and wait
        for each one's result. The first failure among them is raised."""
        if not items:
            return []
        futures = self.enqueue(items)
        return list(await asyncio.gather(*futures))

    def enqueue(self, items: Sequence[T]) -> list[asyncio.Future[R]]:
        """Queue ``items`` and return one future per item, without waiting."""
        if self._closed:
            raise BatcherClosed(f"{self.name} is closed")
        self._ensure_loop()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = []
        if not self._pending:
            self._first_at = loop.time()
        self._last_at = loop.time()
        for item in items:
            fut: asyncio.Future[R] = loop.create_future()
            self._pending.append(_Pending(item, fut))
            futures.append(fut)
        self._arrived.set()
        if self.quiet_s is not None or len(self._pending) >= self.max_items:
            self._wake.set()
        return futures

    # -- the flushing loop -----------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.name}-loop")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait = self._flush_at() - loop.time()
            if wait > 0 and len(self._pending) < self.max_items and not self._closed:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                if self.quiet_s is not None:
                    continue  # an arrival moved the quiet deadline: look again
            await self._slots.acquire()
            batch = self._pending[: self.max_items]
            self._pending = self._pending[self.max_items :]
            if self._pending:
                self._first_at = loop.time()
            task = loop.create_task(self._flush_batch(batch), name=f"{self.name}-flush")
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    def _flush_at(self) -> float:
        at = self._first_at + self.max_wait_s
        return at if self.quiet_s is None else min(at, self._last_at + self.quiet_s)

    async def _flush_batch(self, batch: list[_Pending[T, R]]) -> None:
        try:
            live = [p for p in batch if not p.future.cancelled()]
            if not live:
                return
            try:
                results = await self._flush([p.item for p in live])
                if len(results) != len(live):
                    raise RuntimeError(
                        f"{self.name}: flush returned {len(results)} results for {len(live)} items"
                    )
            except BaseException as exc:
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            self.flushes += 1
            self.flushed_items += len(live)
            for p, result in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(result)
        finally:
            self._slots.release()

    async def close(self) -> None:
        """Flush what is queued, wait for the flushes in flight, then stop."""
        self._closed = True
        self._arrived.set()
        self._wake.set()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
