"""loom.store.write_buffer.Batcher: batches by size, age and (optionally) a pause in
arrivals; answers each caller with its own result; fails a whole batch together."""

from __future__ import annotations

import asyncio

import pytest

from loom.store.write_buffer import Batcher, BatcherClosed


class Recorder:
    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail = fail

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("store down")
        return [i * 10 for i in items]


async def test_concurrent_items_share_one_flush_and_get_their_own_results():
    rec = Recorder()
    b: Batcher[int, int] = Batcher(rec, max_items=100, max_wait_s=0.02)
    results = await asyncio.gather(*(b.submit(i) for i in range(10)))
    assert results == [i * 10 for i in range(10)]
    assert rec.batches == [list(range(10))]
    await b.close()


async def test_size_flushes_before_the_window():
    rec = Recorder()
    b: Batcher[int, int] = Batcher(rec, max_items=4, max_wait_s=10.0)
    got = await asyncio.wait_for(b.submit_many(list(range(8))), 2)
    assert got == [i * 10 for i in range(8)]
    assert rec.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    await b.close()


async def test_without_quiet_the_window_is_waited_out():
    rec = Recorder()
    b: Batcher[int, int] = Batcher(rec, max_items=100, max_wait_s=0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await b.submit(1)
    assert loop.time() - t0 >= 0.29
    await b.close()


async def test_a_pause_in_arrivals_ends_the_window_early():
    rec = Recorder()
    b: Batcher[int, int] = Batcher(rec, max_items=100, max_wait_s=0.5, quiet_s=0.02)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.ensure_future(b.submit(1))
    await asyncio.sleep(0.01)  # within the quiet time: same batch
    second = asyncio.ensure_future(b.submit(2))
    assert await asyncio.gather(first, second) == [10, 20]
    assert rec.batches == [[1, 2]]
    assert loop.time() - t0 < 0.25  # not the 0.5 s window
    await b.close()


async def test_steady_arrivals_still_flush_by_the_window():
    rec = Recorder()
    b: Batcher[int, int] = Batcher(rec, max_items=1000, max_wait_s=0.1, quiet_s=0.05)
    futures = []
    for i in range(20):  # an arrival every 10 ms, never a 50 ms pause
        futures.append(asyncio.ensure_future(b.submit(i)))
        await asyncio.sleep(0.01)
    await asyncio.gather(*futures)
    assert len(rec.batches) >= 2 and sorted(sum(rec.batches, [])) == list(range(20))
    await b.close()


async def test_a_failed_flush_fails_every_item_of_its_batch():
    b: Batcher[int, int] = Batcher(Recorder(fail=True), max_items=100, max_wait_s=0.01)
    results = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    await b.close()


async def test_close_flushes_what_is_queued_and_refuses_more():
    rec = Recorder(delay=0.01)
    b: Batcher[int, int] = Batcher(rec, max_items=100, max_wait_s=10.0)
    pending = asyncio.ensure_future(b.submit(7))
    await asyncio.sleep(0)
    await b.close()
    assert await pending == 70
    with pytest.raises(BatcherClosed):
        await b.submit(8)
