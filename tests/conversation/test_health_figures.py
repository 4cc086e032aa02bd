"""health.show's figures that appends and searches move: the embedding rows by outcome
(ClickHouse), the append outcomes and the rates (this process's counters)."""

from __future__ import annotations

import asyncio

from loom.ops.platform import rates
from loom.providers.embedders import FakeEmbedder


async def _append(call, token: str, ns: str, msg_id: str, content: str, role: str = "user") -> dict:
    r = await call(
        "conversation.append", token, namespace=ns, thread_id="t", role=role, content=content, msg_id=msg_id
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_embedding_rows_and_append_outcomes_by_outcome(call, ns, writer, mint, worker_embedder):
    admin = mint(ns, "admin")
    before = (await call("health.show", admin)).json()["embeddings"]
    assert before["rows"] == []
    assert (await _append(call, writer, ns, "a", "the deploy rolled back"))["embedding"] == "embedded"
    assert (await _append(call, writer, ns, "b", "the ledger moved"))["embedding"] == "embedded"
    assert (await _append(call, writer, ns, "a", "the deploy rolled back"))["reason"] == "duplicate"
    system = await _append(call, writer, ns, "s", "a system note", role="system")
    assert system["embedding"] == "skipped:role"
    worker_embedder(FakeEmbedder(fail=True))
    assert (await _append(call, writer, ns, "c", "this embed fails"))["embedding"] == "failed"
    after = (await call("health.show", admin)).json()["embeddings"]
    assert after["rows"] == [
        {"status": "embedded", "code": "", "rows": 2},
        {"status": "failed", "code": "embedder_unavailable", "rows": 1},
    ]

    def moved(key: str, outcome: str) -> int:
        return after[key].get(outcome, 0) - before[key].get(outcome, 0)

    assert moved("append_outcomes", "stored") == 4 and moved("append_outcomes", "duplicate") == 1
    assert moved("embedding_outcomes", "embedded") == 2 and moved("embedding_outcomes", "failed") == 1
    assert moved("embedding_outcomes", "skipped:role") == 1
    # Another namespace's admin sees none of these rows.
    other = (await call("health.show", mint(f"{ns}x", "admin"))).json()["embeddings"]
    assert other["rows"] == []


async def test_the_rates_move_with_appends_and_searches(call, ns, writer, mint):
    clock = [1000.0]
    sampler = rates.Sampler(clock=lambda: clock[0])
    first, _ = sampler.rates()
    assert first.window_s == 0 and first.append_requests_per_s is None  # one reading: no rate yet
    for i in range(3):
        await _append(call, writer, ns, f"m{i}", f"turn number {i} about the ledger")
    for _ in range(2):
        r = await call("conversation.search", writer, namespace=ns, query="ledger")
        assert r.status_code == 200, r.text
    clock[0] += 2.0
    moved, _ = sampler.rates()
    assert moved.window_s == 2.0
    assert moved.append_requests_per_s == 1.5 and moved.turns_stored_per_s == 1.5
    assert moved.searches_per_s == 1.0
    clock[0] += 63.0  # the burst leaves the minute's window: a later reading shows no traffic
    quiet, _ = sampler.rates()
    assert quiet.append_requests_per_s == 0.0 and quiet.searches_per_s == 0.0


async def test_the_answer_carries_rates_over_a_window(call, ns, writer, mint):
    admin = mint(ns, "admin")
    await call("health.show", admin)
    await asyncio.sleep(1.1)  # readings closer than a second are not kept
    await _append(call, writer, ns, "m", "one more turn")
    body = (await call("health.show", admin)).json()["rates"]
    assert 1.0 <= body["window_s"] <= 70
    assert body["append_requests_per_s"] > 0 and body["turns_stored_per_s"] > 0
