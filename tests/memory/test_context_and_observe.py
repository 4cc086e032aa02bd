"""context.pack (facts, transcript tail when recorded, evidence, a brief only when named,
the token budget) and observe.record / observe.crystallize."""

from __future__ import annotations

import json
from typing import Any

from loom.providers.llm import ScriptedLLM
from loom.store import namespaces, recording_cache
from tests.memory.conftest import api_over


def _section(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in body["sections"] if s["name"] == name)


async def test_pack_has_facts_transcript_and_evidence_with_sources_and_no_brief_unless_named(
    call, ns, mint, services, arq_worker
):
    w = mint(ns, "writer")
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    await call(
        "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Migrating billing to the new ledger"}]
    )
    await call(
        "memory.set_from_messages",
        w,
        namespace=ns,
        user_id="u1",
        messages=[{"role": "user", "content": "the ledger export job runs nightly"}],
    )
    for i, (role, text) in enumerate(
        [("user", "where were we on the ledger?"), ("assistant", "export job next")]
    ):
        r = await call(
            "conversation.append",
            w,
            namespace=ns,
            thread_id="t1",
            role=role,
            content=text,
            user_id="u1",
            msg_id=f"m{i}",
        )
        assert r.status_code == 200, r.text
    r = await call(
        "session.brief_save",
        w,
        namespace=ns,
        brief_key="ledger",
        sections={"goal": "Move invoices to the new ledger"},
    )
    assert r.status_code == 200, r.text

    r = await call("context.pack", w, namespace=ns, user_id="u1", thread_id="t1", query="ledger export")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [s["name"] for s in body["sections"]] == ["facts", "transcript", "evidence"]  # no brief
    assert _section(body, "facts")["items"][0]["source"].startswith("memory:")
    assert [i["source"] for i in _section(body, "transcript")["items"]] == ["turn:m0", "turn:m1"]
    assert _section(body, "evidence")["items"][0]["text"] == "user: the ledger export job runs nightly"
    assert 0 < body["tokens_used"] <= body["token_budget"]
    # Deterministic: the same request, the same pack.
    again = (
        await call("context.pack", w, namespace=ns, user_id="u1", thread_id="t1", query="ledger export")
    ).json()
    assert again == body
    # The brief only when named.
    named = (await call("context.pack", w, namespace=ns, user_id="u1", brief_key="ledger")).json()
    brief = _section(named, "brief")
    assert brief["items"][0]["source"] == "brief:ledger" and "new ledger" in brief["items"][0]["text"]
    # A small budget keeps within it.
    small = (
        await call("context.pack", w, namespace=ns, user_id="u1", thread_id="t1", token_budget=64)
    ).json()
    assert small["tokens_used"] <= 64


async def test_pack_without_recording_has_no_transcript(call, ns, mint):
    w = mint(ns, "writer")
    await call("memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Prefers short answers"}])
    body = (await call("context.pack", w, namespace=ns, user_id="u1", thread_id="t1")).json()
    t = _section(body, "transcript")
    assert t["items"] == [] and t["note"] == "not_recorded"
    assert [i["text"] for i in _section(body, "facts")["items"]] == ["Prefers short answers"]


async def test_an_end_user_tokens_pack_holds_no_transcript_and_a_sessions_pack_knows_its_user(
    call, ns, mint, services, arq_worker
):
    w = mint(ns, "writer")
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    turns = [
        {"thread_id": "t", "msg_id": "a", "role": "user", "user_id": "alice", "content": "alice asks"},
        {"thread_id": "t", "msg_id": "b", "role": "assistant", "user_id": "bob", "content": "to bob"},
        {"thread_id": "t", "msg_id": "c", "role": "user", "content": "nobody's turn"},
    ]
    assert (await call("conversation.append", w, namespace=ns, turns=turns)).status_code == 200
    await call("memory.set", w, namespace=ns, user_id="alice", facts=[{"text": "Lives in Ghent"}])
    await call(
        "memory.set",
        w,
        namespace=ns,
        user_id="alice",
        session_id="s1",
        facts=[{"text": "Debugging the import"}],
    )
    await call(
        "memory.set", w, namespace=ns, user_id="alice", session_id="s2", facts=[{"text": "Another session"}]
    )
    alice = mint(ns, "writer", read_scope="own_user", read_user_id="alice")
    # A thread mixes users: an end-user token's pack has no transcript at all.
    body = (await call("context.pack", alice, namespace="@me", thread_id="t")).json()
    transcript = _section(body, "transcript")
    assert transcript["items"] == [] and transcript["note"] == "bounded_token"
    assert "to bob" not in json.dumps(body) and "nobody's turn" not in json.dumps(body)
    # A session's pack: the user's durable facts and the session's, never another session's.
    for token, user in ((w, {"user_id": "alice"}), (alice, {})):
        body = (await call("context.pack", token, namespace=ns, session_id="s1", **user)).json()
        facts = {i["text"] for i in _section(body, "facts")["items"]}
        assert facts == {"Lives in Ghent", "Debugging the import"}, facts
        queried = (
            await call("context.pack", token, namespace=ns, session_id="s1", query="Ghent", **user)
        ).json()
        assert "Lives in Ghent" in {i["text"] for i in _section(queried, "facts")["items"]}
    # A token pinned to one session keeps to that session's facts.
    pinned = mint(ns, "writer", read_scope="own_session", read_user_id="alice", read_session_id="s1")
    body = (await call("context.pack", pinned, namespace="@me")).json()
    assert {i["text"] for i in _section(body, "facts")["items"]} == {"Debugging the import"}


async def test_observations_are_evidence_and_crystallize_makes_facts(make_svc, ns, mint):
    w = mint(ns, "writer")
    llm = ScriptedLLM([json.dumps({"facts": ["The repo's tests run with make test"]})])
    async with api_over(make_svc(llm)) as call:
        r = await call(
            "observe.record",
            w,
            namespace=ns,
            user_id="u1",
            run_id="r1",
            tool="bash",
            input_summary="make test",
            outcome="412 passed",
        )
        assert r.status_code == 200, r.text
        r = await call(
            "observe.record",
            w,
            namespace=ns,
            user_id="u1",
            run_id="r1",
            tool="bash",
            input_summary="export KEY",
            outcome="password=Tr0ub4dor&3xq",
        )
        # Recording an observation makes no fact.
        assert (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"] == []
        hits = (await call("memory.recall", w, namespace=ns, user_id="u1", query="make test")).json()["hits"]
        assert [h["source"] for h in hits] == ["observation"] and hits[0][
            "content"
        ] == "bash: make test -> 412 passed"
        r = await call("observe.crystallize", w, namespace=ns, user_id="u1", run_id="r1")
        assert r.status_code == 200, r.text
        assert r.json()["extracted"] == 1 and len(r.json()["evidence_ids"]) == 1  # the high one is not read
    assert "Tr0ub4dor" not in llm.calls[0].messages[1].content
    async with api_over(make_svc()) as call:
        facts = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    assert [(f["text"], f["source"]) for f in facts] == [
        ("The repo's tests run with make test", "crystallize")
    ]
