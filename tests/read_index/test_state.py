"""loom.read_index.state: loads, events met while loading, re-reads, the budget, and when
a search may trust what the index holds (no backend: the store's reads are a dict)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from loom.read_index.feed import Row
from loom.read_index.state import HOLD_NS, ReadIndex
from loom.read_index.vectors import Wanted
from loom.store.search_marks import CLOCK_MARGIN_NS

Q = np.array([1.0, 0.0], dtype=np.float32)


def _row(ns: str, thread: str, msg: str, version: int, live: bool = True) -> Row:
    vec = np.array([1.0, 0.1 * version], dtype=np.float32) if live else None
    return Row(ns, thread, msg, version, "a", "user", "", "", 0, "text", "m", vec)


class Store:
    """What ClickHouse holds, per namespace; a read can be held back to race it."""

    def __init__(self) -> None:
        self.rows: dict[str, list[Row]] = {}
        self.gate: asyncio.Event | None = None

    async def read(self, ns: str, thread: str | None) -> list[Row]:
        got = [r for r in self.rows.get(ns, []) if thread is None or r.thread_id == thread]
        if self.gate is not None:
            await self.gate.wait()
        return got


async def _settled(index: ReadIndex) -> None:
    for _ in range(200):
        if not index.queue and not index.loading and not index._tasks:
            return
        await asyncio.sleep(0.005)


def _ids(index: ReadIndex, ns: str) -> list[str]:
    found, missing = index.search([ns], Q, Wanted(), 10)
    assert not missing
    return sorted(f.msg_id for _, f in found)


async def test_events_met_while_a_namespace_loads_are_applied_after_its_read():
    store = Store()
    store.rows["ns"] = [_row("ns", "t", "a", 1), _row("ns", "t", "b", 1)]
    index = ReadIndex(store.read, 1 << 20)
    loader = asyncio.ensure_future(index.loader())
    store.gate = asyncio.Event()
    index.listing(["ns"])
    await asyncio.sleep(0.01)
    assert index.search(["ns"], Q, Wanted(), 10) == ([], ["ns"])  # loading: left to the engine
    index.apply_rows([_row("ns", "t", "b", 2, live=False), _row("ns", "t", "c", 1)], 0)
    store.gate.set()
    await _settled(index)
    assert _ids(index, "ns") == ["a", "c"]  # b's tombstone came after the read began
    loader.cancel()


async def test_a_namespace_with_no_rows_when_listed_is_held_from_its_first_event():
    index = ReadIndex(Store().read, 1 << 20)
    index.listing([])
    assert index.search(["new"], Q, Wanted(), 10) == ([], [])  # nothing anywhere: nothing missing
    index.apply_rows([_row("new", "t", "a", 1)], 0)
    assert _ids(index, "new") == ["a"]
    # A query of another model than the one that made the held vectors: the engine's.
    assert index.search(["new"], Q, Wanted(model="another"), 10) == ([], ["new"])
    assert [f.msg_id for _, f in index.search(["new"], Q, Wanted(model="m"), 10)[0]] == ["a"]


async def test_a_raised_mark_makes_the_thread_doubted_until_the_hold_passes_and_it_was_read_again():
    store = Store()
    store.rows["ns"] = [_row("ns", "t", "a", 1), _row("ns", "u", "b", 1)]
    index = ReadIndex(store.read, 1 << 20)
    loader = asyncio.ensure_future(index.loader())
    index.listing(["ns"])
    await _settled(index)
    now = time.time_ns()
    assert index.trusted("ns", "t", 0, now)  # never changed
    mark = now + CLOCK_MARGIN_NS
    store.rows["ns"] = [_row("ns", "u", "b", 1)]  # a lightweight DELETE of a: no row event
    assert not index.trusted("ns", "t", mark, now)  # within the hold: verified
    index.apply_marks([("ns", "t")], 0)  # the writer's raise reaches the index: a re-read
    await _settled(index)
    assert _ids(index, "ns") == ["b"]
    assert index.trusted("ns", "t", mark, mark + HOLD_NS + 1)
    assert index.trusted("ns", "u", 0, now)  # the other thread never was in doubt
    loader.cancel()


async def test_a_mark_whose_event_was_lost_is_read_again_once_seen():
    store = Store()
    store.rows["ns"] = [_row("ns", "t", "a", 1)]
    index = ReadIndex(store.read, 1 << 20)
    loader = asyncio.ensure_future(index.loader())
    index.listing(["ns"])
    await _settled(index)
    late = time.time_ns() + 10 * CLOCK_MARGIN_NS  # a change after the load, its event lost
    store.rows["ns"] = []
    assert not index.trusted("ns", "t", late, late + HOLD_NS + 1)  # doubted, and re-read
    await _settled(index)
    assert _ids(index, "ns") == []
    loader.cancel()


async def test_a_namespace_wide_mark_reloads_the_namespace():
    store = Store()
    store.rows["ns"] = [_row("ns", "t", "a", 1), _row("ns", "u", "b", 1)]
    index = ReadIndex(store.read, 1 << 20)
    loader = asyncio.ensure_future(index.loader())
    index.listing(["ns"])
    await _settled(index)
    store.rows["ns"] = [_row("ns", "u", "b", 1)]  # an erasure's INSERT ... SELECT
    index.apply_marks([("ns", "")], 0)
    assert index.search(["ns"], Q, Wanted(), 10)[1] == ["ns"]  # reloading: the engine answers
    await _settled(index)
    assert _ids(index, "ns") == ["b"]
    loader.cancel()


async def test_the_least_recently_searched_namespace_leaves_first_and_a_giant_is_refused():
    store = Store()
    for ns in ("one", "two", "three"):
        store.rows[ns] = [_row(ns, "t", f"m{i}", 1) for i in range(100)]
    probe = ReadIndex(store.read, 1 << 30)
    loader = asyncio.ensure_future(probe.loader())
    probe.listing(["one"])
    await _settled(probe)
    size = probe.nbytes
    loader.cancel()
    index = ReadIndex(store.read, int(size * 2.5))
    loader = asyncio.ensure_future(index.loader())
    index.listing(["one", "two", "three"])
    await _settled(index)
    assert set(index.held) == {"two", "three"}  # "one", loaded first, left first
    index.search(["two"], Q, Wanted(), 1)  # "three" is now the least recently searched
    assert index.search(["one"], Q, Wanted(), 1)[1] == ["one"]  # let go: left to the engine, loaded
    await _settled(index)
    assert set(index.held) == {"one", "two"} and index.nbytes <= index.budget
    tiny = ReadIndex(store.read, size // 2)
    tl = asyncio.ensure_future(tiny.loader())
    tiny.listing(["one"])
    await _settled(tiny)
    assert tiny.search(["one"], Q, Wanted(), 1)[1] == ["one"] and not tiny.queue  # refused, not retried
    loader.cancel()
    tl.cancel()
