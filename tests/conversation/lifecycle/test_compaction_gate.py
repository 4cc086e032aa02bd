"""The compaction gate: a bound on store steps at once, and a rest after each."""

from __future__ import annotations

import asyncio

from loom.ops.conversation.lifecycle.compaction_gate import CompactionGate


async def _step(gate: CompactionGate, seconds: float, log: list[tuple[str, float]], name: str) -> None:
    loop = asyncio.get_running_loop()
    async with gate:
        log.append((f"{name} in", loop.time()))
        await asyncio.sleep(seconds)
        log.append((f"{name} out", loop.time()))


async def test_the_next_step_waits_pace_times_the_last_one() -> None:
    gate = CompactionGate(1, pace=2.0)
    log: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(_step(gate, 0.05, log, "a"), _step(gate, 0.05, log, "b"))
    at = dict(log)
    assert at["a in"] - t0 < 0.02  # the first step of a burst is not slowed
    assert at["b in"] - at["a out"] >= 2.0 * (at["a out"] - at["a in"]) - 0.005
    assert at["b in"] >= at["a out"]  # one at a time


async def test_without_pace_steps_follow_back_to_back_within_the_bound() -> None:
    gate = CompactionGate(2, pace=0.0)
    log: list[tuple[str, float]] = []
    await asyncio.gather(*(_step(gate, 0.05, log, n) for n in "abc"))
    at = dict(log)
    assert at["b in"] - at["a in"] < 0.02  # two at once
    assert at["c in"] >= min(at["a out"], at["b out"])  # the third waits for a slot
    assert at["c in"] - min(at["a out"], at["b out"]) < 0.02


async def test_a_step_cancelled_while_resting_gives_its_slot_back() -> None:
    gate = CompactionGate(1, pace=10.0)
    log: list[tuple[str, float]] = []
    await _step(gate, 0.02, log, "a")  # the gate now rests ~0.2 s
    waiting = asyncio.ensure_future(_step(gate, 0.0, log, "b"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not gate._slots.locked()  # noqa: SLF001 - the slot came back
