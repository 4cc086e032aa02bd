"""memory.profile: built from the current facts (by the model over the stand-in LLM, or
from the facts alone with the fake LLM), rebuilt after an extraction and after
memory.set / memory.delete, never holding text that reads as high; context.pack's
profile section; roles and scopes."""

from __future__ import annotations

from typing import Any

import pytest

from loom.providers.llm import ScriptedLLM
from tests.memory.conftest import api_over
from tests.memory.test_extraction import CHAT, Model, _svc
from tests.providers.standin import StandInServer

pytestmark = pytest.mark.timeout(120)
HIGH = "my SSN is 123-45-6789"


async def _ok(call: Any, op: str, token: str, **body: Any) -> dict[str, Any]:
    r = await call(op, token, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_with_the_fake_llm_the_profile_is_the_facts_by_kind_and_follows_set_and_delete(call, ns, mint):
    w = mint(ns, "writer")
    out = await _ok(
        call,
        "memory.set",
        w,
        namespace=ns,
        user_id="u1",
        facts=[
            {"text": "Prefers dark mode", "kind": "preference"},
            {"text": "Works at Acme", "kind": "work"},
            {"text": "Plays the cello"},
        ],
    )
    p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
    assert p["basis"] == "facts" and p["reason"] == "llm_not_configured" and p["rebuilt"]
    assert [(s["name"], s["text"]) for s in p["sections"]] == [
        ("preference", "Prefers dark mode"),
        ("work", "Works at Acme"),
        ("general", "Plays the cello"),
    ]
    assert sorted(p["fact_ids"]) == sorted(r["memory_id"] for r in out["results"])
    again = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
    assert not again["rebuilt"] and again["sections"] == p["sections"]
    # A fact just set is in the next answer.
    await _ok(
        call,
        "memory.set",
        w,
        namespace=ns,
        user_id="u1",
        facts=[{"text": "Prefers tea to coffee", "kind": "preference"}],
    )
    p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
    assert p["rebuilt"] and "Prefers tea to coffee" in p["sections"][0]["text"]
    # A forgotten fact leaves the profile at once (the stored version keeps no text).
    await _ok(
        call, "memory.delete", w, namespace=ns, user_id="u1", memory_ids=[out["results"][1]["memory_id"]]
    )
    p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
    assert all("Acme" not in s["text"] for s in p["sections"])
    # An empty user has an empty profile.
    p = await _ok(call, "memory.profile", w, namespace=ns, user_id="nobody")
    assert p["sections"] == [] and p["reason"] == "no_facts"


async def test_an_extraction_rebuilds_the_profile_with_the_model_and_a_high_section_is_dropped(
    make_svc, ns, mint, services
):
    w = mint(ns, "writer")
    with StandInServer() as srv:
        model = Model(
            ["Lives in Lisbon", "Drinks tea"],
            lambda existing, new: [{"event": "ADD", "text": t} for t in new],
            profile=lambda facts: {
                "identity": "Lives in Lisbon.",
                "preferences": "Drinks tea.",
                "other": "Their " + HIGH,
                "unknown_section": "ignored",
            },
        )
        srv.chat_reply = model
        async with api_over(_svc(make_svc, srv)) as call:
            body = await _ok(call, "memory.set_from_messages", w, namespace=ns, user_id="u1", messages=CHAT)
            assert [d["action"] for d in body["decisions"]] == ["add", "add"]
            # The extraction built it: the read does not call the model again.
            sent = len(srv.requests_to(srv.CHAT))
            p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
            assert len(srv.requests_to(srv.CHAT)) == sent and not p["rebuilt"]
            assert p["basis"] == "llm" and p["reason"] is None and p["dropped"] == 1
            assert [(s["name"], s["text"]) for s in p["sections"]] == [
                ("identity", "Lives in Lisbon."),
                ("preferences", "Drinks tea."),
            ]
            assert {f["text"] for f in model.profile_inputs[0]["facts"]} == {"Lives in Lisbon", "Drinks tea"}
            # context.pack includes it when asked, within the budget, never the high text.
            pack = await _ok(call, "context.pack", w, namespace=ns, user_id="u1", include_profile=True)
            section = next(s for s in pack["sections"] if s["name"] == "profile")
            assert [i["source"] for i in section["items"]] == ["profile:identity", "profile:preferences"]
            assert HIGH not in str(pack) and "Lives in Lisbon." in section["items"][0]["text"]
            assert [s["name"] for s in pack["sections"]][:2] == ["profile", "facts"]
            small = await _ok(
                call, "context.pack", w, namespace=ns, user_id="u1", include_profile=True, token_budget=64
            )
            assert small["tokens_used"] <= 64
            plain = await _ok(call, "context.pack", w, namespace=ns, user_id="u1")
            assert "profile" not in [s["name"] for s in plain["sections"]]
    rows = services.ch.query(
        "SELECT section_texts FROM memory_profiles WHERE namespace = {ns:String}", parameters={"ns": ns}
    ).result_rows
    assert rows and all(HIGH not in t for (texts,) in rows for t in texts)  # never stored


async def test_context_pack_builds_a_stale_profile_from_the_facts_without_a_model(make_svc, ns, mint):
    w = mint(ns, "writer")
    llm = ScriptedLLM(lambda msgs: '{"sections": {"identity": "from the model"}}')
    async with api_over(make_svc(llm)) as call:
        await _ok(
            call, "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Keeps bees", "kind": "hobby"}]
        )
        pack = await _ok(call, "context.pack", w, namespace=ns, user_id="u1", include_profile=True)
        section = next(s for s in pack["sections"] if s["name"] == "profile")
        assert [i["text"] for i in section["items"]] == ["hobby: Keeps bees"] and llm.calls == []
        p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")  # rebuilt by the model
        assert p["basis"] == "llm" and [s["text"] for s in p["sections"]] == ["from the model"]
        pack = await _ok(call, "context.pack", w, namespace=ns, user_id="u1", include_profile=True)
        section = next(s for s in pack["sections"] if s["name"] == "profile")
        assert [i["text"] for i in section["items"]] == ["identity: from the model"] and len(llm.calls) == 1


async def test_a_deferred_extraction_rebuilds_the_profile(call, ns, mint, services, arq_worker):
    from arq.jobs import Job

    from loom.queue import QUEUE

    w = mint(ns, "writer")
    wsvc = arq_worker.ctx["loom"]
    previous = wsvc.llm
    wsvc.llm = ScriptedLLM(
        ['{"facts": ["Has two daughters"]}', '{"sections": {"relationships": "Two daughters."}}']
    )
    try:
        body = await _ok(
            call,
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            defer=True,
            messages=[{"role": "user", "content": "My two daughters start school in May."}],
        )
        await Job(body["job_id"], services.arq, _queue_name=QUEUE).result(timeout=30)
    finally:
        wsvc.llm = previous
    p = await _ok(call, "memory.profile", w, namespace=ns, user_id="u1")
    assert not p["rebuilt"] and [(s["name"], s["text"]) for s in p["sections"]] == [
        ("relationships", "Two daughters.")
    ]


async def test_profile_roles_and_scopes(call, ns, mint):
    w = mint(ns, "writer")
    await _ok(call, "memory.set", w, namespace=ns, user_id="alice", facts=[{"text": "Has a cat"}])
    await _ok(
        call, "memory.set", w, namespace=ns, user_id="alice", session_id="s2", facts=[{"text": "Owns a boat"}]
    )
    viewer = mint(ns, "viewer")
    alice = mint(ns, "viewer", read_scope="own_user", read_user_id="alice")
    bob = mint(ns, "viewer", read_scope="own_user", read_user_id="bob")
    sess = mint(ns, "viewer", read_scope="own_session", read_user_id="alice", read_session_id="s2")
    p = await _ok(call, "memory.profile", viewer, namespace=ns, user_id="alice")
    assert "Has a cat" in str(p["sections"])
    p = await _ok(call, "memory.profile", alice, namespace="@me")
    assert "Has a cat" in str(p["sections"])
    r = await call("memory.profile", bob, namespace=ns, user_id="alice")
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    p = await _ok(call, "memory.profile", bob, namespace="@me")
    assert p["sections"] == []
    # A token pinned to a session: that session's facts only, not stored.
    p = await _ok(call, "memory.profile", sess, namespace="@me")
    assert p["reason"] == "session_scope" and [s["text"] for s in p["sections"]] == ["Owns a boat"]
    pack = await _ok(call, "context.pack", sess, namespace="@me", include_profile=True)
    assert "Has a cat" not in str(pack) and "Owns a boat" in str(pack)
    r = await call("memory.profile", mint(ns, "viewer"), namespace=ns)
    assert r.status_code == 422 and r.json()["field"] == "user_id"
