"""Erasure of a user's facts and evidence; memory.set_from_messages with `defer: true`
on the arq pool."""

from __future__ import annotations

import json
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


async def _export(call: Any, admin: str, **body: Any) -> list[dict[str, Any]]:
    r = await call("erasure.export", admin, **body)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


async def test_export_holds_the_users_facts_evidence_and_decisions(call, ns, mint, services):
    from loom.auth.principal import Principal, Role
    from loom.ops.erasure.exporting import export

    w, admin = mint(ns, "writer"), mint(ns, "admin")
    await _seed(call, w, ns, "u1")
    await _seed(call, w, ns, "u2")
    r = await call(
        "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "u1 plays chess", "kind": "hobby"}]
    )
    gone = r.json()["results"][0]["memory_id"]
    assert (await call("memory.delete", w, namespace=ns, user_id="u1", memory_ids=[gone])).status_code == 200
    services.ch.command(
        "INSERT INTO memory_decisions (namespace, user_id, extraction_id, seq, action, memory_id, "
        "text, evidence_ids, created_at) VALUES ({ns:String}, 'u1', 'x1', 0, 'add', 'm1', 'a fact', "
        "['e1'], now64(3)), ({ns:String}, 'u1', 'x1', 1, 'delete', 'm2', '', ['e1'], now64(3))",
        parameters={"ns": ns},
    )
    lines = await _export(call, admin, user_id="u1")
    assert lines[-1] == {"kind": "end", "rows": len(lines) - 2}
    facts = [x for x in lines if x["kind"] == "memory"]
    assert {f["text"] for f in facts} == {"u1 collects vinyl records", ""}
    assert [f["memory_id"] for f in facts if f["tombstoned"]] == [gone]
    assert all("embedding" not in f and f["user_id"] == "u1" for f in facts)
    evidence = [x for x in lines if x["kind"] == "memory_evidence"]
    assert [e["content"] for e in evidence] == ["u1 says the vinyl shop reopened"]
    decisions = [x for x in lines if x["kind"] == "memory_decision"]
    assert [(d["seq"], d["action"]) for d in decisions] == [(0, "add"), (1, "delete")]
    assert "u2" not in json.dumps(lines[1:])
    live = await _export(call, admin, user_id="u1", include_tombstoned=False)
    assert [f["text"] for f in live if f["kind"] == "memory"] == ["u1 collects vinyl records"]
    assert len([x for x in live if x["kind"] == "memory_decision"]) == 2
    # Paged in key order: the same rows whatever the page size.
    who = Principal("adm", (ns,), Role.admin)
    paged = b"".join([chunk async for chunk in export(services, who, "u1", None, page_rows=1)])
    small = [json.loads(x) for x in paged.splitlines()]
    assert [x for x in small if x["kind"].startswith("memory")] == [
        x for x in lines if x["kind"].startswith("memory")
    ]
