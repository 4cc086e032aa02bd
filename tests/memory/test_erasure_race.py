"""Memory writes racing an erasure of their user: whatever a write that began before the
erasure ended inserted is gone afterwards (loom.ops.memory.erasing); a write that
begins after it is new memory and stays."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loom import redis_keys
from loom.providers.llm import ScriptedLLM
from tests.memory.conftest import api_over

pytestmark = pytest.mark.timeout(120)
MEMORY_TABLES = ("memories", "memory_terms", "memory_evidence", "evidence_terms", "memory_decisions")


def _readable(ch: Any, table: str, ns: str, user: str) -> int:
    """Rows of the user a read can see (lightweight-deleted rows are masked)."""
    return int(
        ch.query(
            f"SELECT count() FROM {table} WHERE namespace = {{ns:String}} AND user_id = {{u:String}}",
            parameters={"ns": ns, "u": user},
        ).result_rows[0][0]
    )


class Gate:
    """An LLM answer held until the test releases it, so the erasure runs in between."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, _messages: Any) -> str:
        self.entered.set()
        await asyncio.wait_for(self.release.wait(), 60)
        return self.reply


async def _nothing_of(call: Any, w: str, ns: str, user: str, ch: Any) -> None:
    for table in MEMORY_TABLES:
        assert _readable(ch, table, ns, user) == 0, table
    r = await call("memory.search", w, namespace=ns, user_id=user, query="sailing boat")
    assert r.json()["hits"] == []
    assert (await call("memory.recall", w, namespace=ns, user_id=user)).json()["hits"] == []
    assert (await call("memory.list", w, namespace=ns, user_id=user)).json()["facts"] == []


async def test_an_extraction_that_an_erasure_outlives_leaves_nothing(ns, mint, make_svc, services):
    gate = Gate('{"facts": ["Owns a sailing boat"]}')
    svc = make_svc(ScriptedLLM(gate))
    w, admin = mint(ns, "writer"), mint(ns, "admin")
    async with api_over(svc) as call:
        extraction = asyncio.create_task(
            call(
                "memory.set_from_messages",
                w,
                namespace=ns,
                user_id="u1",
                messages=[{"role": "user", "content": "I bought a sailing boat last week."}],
            )
        )
        await asyncio.wait_for(gate.entered.wait(), 30)  # the evidence is stored and read
        r = await call("erasure.request", admin, user_id="u1")
        assert r.status_code == 200, r.text
        gate.release.set()
        r = await extraction
        assert r.status_code == 200, r.text
        assert r.json()["reason"] == "subject_erased" and r.json()["decisions"] == []
        await _nothing_of(call, w, ns, "u1", services.ch)
        # A write that starts after the erasure ended is new memory.
        r = await call("memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Owns a sailing boat"}])
        assert r.json()["results"][0]["stored"] is True
        r = await call("memory.search", w, namespace=ns, user_id="u1", query="sailing boat")
        assert [h["text"] for h in r.json()["hits"]] == ["Owns a sailing boat"]


async def test_a_deferred_extraction_racing_an_erasure_leaves_nothing(call, ns, mint, services, arq_worker):
    from arq.jobs import Job

    from loom.queue import QUEUE

    gate = Gate('{"facts": ["Owns a sailing boat"]}')
    wsvc = arq_worker.ctx["loom"]
    previous, wsvc.llm = wsvc.llm, ScriptedLLM(gate)
    w, admin = mint(ns, "writer"), mint(ns, "admin")
    try:
        r = await call(
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            defer=True,
            messages=[{"role": "user", "content": "I bought a sailing boat last week."}],
        )
        assert r.status_code == 200 and r.json()["reason"] == "deferred", r.text
        await asyncio.wait_for(gate.entered.wait(), 30)  # the job read the evidence
        assert (await call("erasure.request", admin, user_id="u1")).status_code == 200
        gate.release.set()
        result = await Job(r.json()["job_id"], services.arq, _queue_name=QUEUE).result(timeout=30)
    finally:
        wsvc.llm = previous
    assert result["reason"] == "subject_erased" and result["decisions"] == []
    await _nothing_of(call, w, ns, "u1", services.ch)


async def test_writes_storming_an_erasure_leave_only_what_began_after_it(call, ns, mint, services):
    """memory.set and memory.set_from_messages (fake LLM: evidence only) in a loop, from
    several tasks, while the erasure runs: afterwards every readable row of the user was
    written by a call that began after the erasure had ended."""
    w, admin = mint(ns, "writer"), mint(ns, "admin")
    stop, looped = asyncio.Event(), asyncio.Event()
    counter = iter(range(1_000_000))

    async def writer() -> None:
        while not stop.is_set():
            i = next(counter)
            await call("memory.set", w, namespace=ns, user_id="u1", facts=[{"text": f"sailing boat {i}"}])
            await call(
                "memory.set_from_messages",
                w,
                namespace=ns,
                user_id="u1",
                messages=[{"role": "user", "content": f"my sailing boat number {i}", "msg_id": f"m{i}"}],
            )
            looped.set()

    tasks = [asyncio.create_task(writer()) for _ in range(4)]
    # The erasure starts once a writer has been round once (the four keep writing).
    await asyncio.wait_for(looped.wait(), 60)
    await asyncio.sleep(0.3)
    r = await call("erasure.request", admin, user_id="u1")
    assert r.status_code == 200, r.text
    stop.set()
    await asyncio.gather(*tasks)
    mark = await services.redis.get(redis_keys.memory_erasing(ns, "u1"))
    done_at = int(mark.decode() if isinstance(mark, bytes) else mark)
    for table in ("memories", "memory_evidence"):
        versions = services.ch.query(
            f"SELECT version FROM {table} WHERE namespace = {{ns:String}} AND user_id = 'u1'",
            parameters={"ns": ns},
        ).result_rows
        # Stamped after the erasure ended means the call began after it ended.
        assert all(int(v) > done_at for (v,) in versions), table
    # the writers ran around the erasure: four first rounds, and a writer went round
    # again before the erasure was asked (how many more fit in it depends on the load)
    assert next(counter) > 4
