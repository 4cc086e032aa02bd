"""Erasure of a user's facts and evidence; memory.set_from_messages with `defer: true`
on the arq pool."""

from __future__ import annotations

from typing import Any

import pytest

from loom.providers.llm import ScriptedLLM
from tests.conversation.conftest import wait_for

pytestmark = pytest.mark.timeout(90)
MEMORY_TABLES = ("memories", "memory_terms", "memory_evidence", "evidence_terms", "memory_decisions")


def _count(ch: Any, table: str, ns: str, user: str) -> int:
    return int(
        ch.query(
            f"SELECT count() FROM {table} WHERE namespace = {{ns:String}} AND user_id = {{u:String}} "
            "SETTINGS apply_deleted_mask = 0",
            parameters={"ns": ns, "u": user},
        ).result_rows[0][0]
    )


async def _seed(call: Any, w: str, ns: str, user: str) -> None:
    r = await call(
        "memory.set", w, namespace=ns, user_id=user, facts=[{"text": f"{user} collects vinyl records"}]
    )
    assert r.status_code == 200, r.text
    r = await call(
        "memory.set_from_messages",
        w,
        namespace=ns,
        user_id=user,
        messages=[{"role": "user", "content": f"{user} says the vinyl shop reopened"}],
    )
    assert r.status_code == 200, r.text


async def test_a_user_erasure_covers_facts_and_evidence(call, ns, mint, services, arq_worker):
    w, admin = mint(ns, "writer"), mint(ns, "admin")
    await _seed(call, w, ns, "u1")
    await _seed(call, w, ns, "u2")
    services.ch.command(
        "INSERT INTO memory_decisions (namespace, user_id, extraction_id, seq, action, memory_id, "
        "text, evidence_ids, created_at) VALUES ({ns:String}, 'u1', 'x1', 0, 'add', 'm1', 'a fact', "
        "[], now64(3))",
        parameters={"ns": ns},
    )
    r = await call("erasure.request", admin, user_id="u1")
    assert r.status_code == 200, r.text
    got = r.json()
    tables = got["receipt"]["tables"]
    assert tables["memories"]["tombstoned"] == 1 and tables["memory_evidence"]["tombstoned"] == 1
    assert tables["memory_decisions"]["tombstoned"] == 1
    # Unreadable at once.
    for op, extra in (("memory.search", {"query": "vinyl records"}), ("memory.recall", {"query": "vinyl"})):
        r = await call(op, w, namespace=ns, user_id="u1", **extra)
        assert r.json()["hits"] == [], op
    assert (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"] == []

    async def done() -> bool:
        return (await call("erasure.status", admin, erasure_id=got["erasure_id"])).json()["state"] == "done"

    assert await wait_for(done, timeout=60)
    for table in MEMORY_TABLES:
        assert _count(services.ch, table, ns, "u1") == 0, table
    # u2 keeps everything.
    assert (
        _count(services.ch, "memories", ns, "u2") == 1
        and _count(services.ch, "memory_evidence", ns, "u2") == 1
    )
    r = await call("memory.search", w, namespace=ns, user_id="u2", query="vinyl records")
    assert [h["text"] for h in r.json()["hits"]] == ["u2 collects vinyl records"]


async def test_defer_runs_the_extraction_on_the_worker_pool(call, ns, mint, services, arq_worker):
    from arq.jobs import Job

    from loom.queue import QUEUE

    w = mint(ns, "writer")
    wsvc = arq_worker.ctx["loom"]
    previous = wsvc.llm
    wsvc.llm = ScriptedLLM(['{"facts": ["Has two daughters"]}'])
    try:
        r = await call(
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            defer=True,
            messages=[{"role": "user", "content": "My two daughters start school in May."}],
        )
        body = r.json()
        assert r.status_code == 200 and body["reason"] == "deferred" and body["job_id"]
        assert body["decisions"] == [] and len(body["evidence_ids"]) == 1
        # The evidence is readable before the job runs.
        result = await Job(body["job_id"], services.arq, _queue_name=QUEUE).result(timeout=30)
    finally:
        wsvc.llm = previous
    assert result["extracted"] == 1 and [d["action"] for d in result["decisions"]] == ["add"]
    facts = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    assert [f["text"] for f in facts] == ["Has two daughters"]
    assert facts[0]["evidence_ids"] == body["evidence_ids"]
