"""memory.set_from_messages over the real OpenAI-compatible provider against the local
stand-in chat server: evidence first, then add / update / delete / leave decisions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from loom.providers.llm import build_llm
from loom.store import memories as mem_store
from loom.store import namespaces, recording_cache
from tests.memory.conftest import api_over
from tests.providers.standin import RecordedRequest, StandInServer

pytestmark = pytest.mark.timeout(90)

CHAT = [
    {"role": "user", "content": "I moved from Berlin to Lisbon last month."},
    {"role": "assistant", "content": "Nice! How is Lisbon treating you?"},
    {"role": "user", "content": "Great. I stopped drinking coffee, only tea now. Still vegetarian."},
]


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        yield srv


class Model:
    """The stand-in's chat answers: extraction returns `facts`; a decision call returns
    `decide(existing, new_facts)`. Records what each call was sent."""

    def __init__(self, facts: list[str], decide: Any = None, profile: Any = None) -> None:
        self.facts, self.decide = facts, decide
        self.profile = profile or (lambda facts: {"identity": "; ".join(f["text"] for f in facts)})
        self.extract_inputs: list[str] = []
        self.decide_inputs: list[dict[str, Any]] = []
        self.profile_inputs: list[dict[str, Any]] = []

    def __call__(self, req: RecordedRequest) -> str:
        system, user = req.json["messages"][0]["content"], req.json["messages"][1]["content"]
        if "extract durable facts" in system:
            self.extract_inputs.append(user)
            return json.dumps({"facts": self.facts})
        if "living profile" in system:
            self.profile_inputs.append(json.loads(user))
            return json.dumps({"sections": self.profile(json.loads(user)["facts"])})
        payload = json.loads(user)
        self.decide_inputs.append(payload)
        return json.dumps({"decisions": self.decide(payload["existing"], payload["new_facts"])})


def _svc(make_svc: Any, srv: StandInServer) -> Any:
    return make_svc(build_llm("openai", base_url=srv.url, api_key="k", model="m", timeout=5.0))


def _by_text(existing: list[dict[str, str]], needle: str) -> str:
    return next(e["id"] for e in existing if needle in e["text"])


async def test_add_update_delete_and_leave(make_svc, standin, ns, mint, services):
    w = mint(ns, "writer")
    svc = _svc(make_svc, standin)
    async with api_over(svc) as call:
        r = await call(
            "memory.set",
            w,
            namespace=ns,
            user_id="u1",
            facts=[
                {"text": "Lives in Berlin"},
                {"text": "Drinks coffee every morning"},
                {"text": "Is vegetarian"},
            ],
        )
        ids = {
            f["text"]: f["memory_id"]
            for f in (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
        }
        model = Model(
            ["Lives in Lisbon", "Does not drink coffee, drinks tea", "Is vegetarian", "Plays the cello"],
            lambda existing, new: [
                {"event": "UPDATE", "id": _by_text(existing, "Berlin"), "text": "Lives in Lisbon"},
                {"event": "DELETE", "id": _by_text(existing, "coffee")},
                {"event": "NONE", "id": _by_text(existing, "vegetarian")},
                {"event": "ADD", "text": "Plays the cello"},
            ],
        )
        standin.chat_reply = model
        r = await call(
            "memory.set_from_messages", w, namespace=ns, user_id="u1", session_id="s1", messages=CHAT
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["reason"] is None and body["extracted"] == 4 and len(body["evidence_ids"]) == 3
        actions = {(d["action"], d["memory_id"]) for d in body["decisions"]}
        added = next(d["memory_id"] for d in body["decisions"] if d["action"] == "add")
        update = next(d for d in body["decisions"] if d["action"] == "update")
        assert update["supersedes"] == ids["Lives in Berlin"]  # a new fact replaced it
        assert actions == {
            ("update", update["memory_id"]),
            ("delete", ids["Drinks coffee every morning"]),
            ("leave", ids["Is vegetarian"]),
            ("add", added),
        }
        # The model saw the conversation, and the scope's similar facts.
        assert "Lisbon" in model.extract_inputs[0]
        assert {e["text"] for e in model.decide_inputs[0]["existing"]} >= {"Lives in Berlin", "Is vegetarian"}
        facts = {
            f["text"]: f for f in (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
        }
        assert set(facts) == {"Lives in Lisbon", "Is vegetarian", "Plays the cello"}
        assert facts["Lives in Lisbon"]["memory_id"] == update["memory_id"]
        assert facts["Lives in Lisbon"]["supersedes"] == ids["Lives in Berlin"]
        assert facts["Lives in Lisbon"]["source"] == "extraction"
        assert facts["Lives in Lisbon"]["evidence_ids"] == body["evidence_ids"]
        assert facts["Is vegetarian"]["source"] == "set"  # left alone
        # Each decision is recorded with the evidence it came from.
        rows = mem_store.decisions(services.ch, ns, "u1", body["extraction_id"])
        assert sorted(r["action"] for r in rows) == ["add", "delete", "leave", "update"]
        assert all(r["evidence_ids"] == body["evidence_ids"] for r in rows)
        # The search finds the updated fact with its source.
        r = await call(
            "memory.search", w, namespace=ns, user_id="u1", query="where does the user live Lisbon"
        )
        hit = next(h for h in r.json()["hits"] if h["text"] == "Lives in Lisbon")
        assert hit["source"] == "extraction" and "lexical" in hit["legs"]
        assert hit["evidence_ids"] == body["evidence_ids"]


async def test_with_no_similar_facts_everything_is_added_in_one_call(make_svc, standin, ns, mint):
    w = mint(ns, "writer")
    standin.chat_reply = Model(["Owns a sailboat", "my SSN is 123-45-6789"])
    async with api_over(_svc(make_svc, standin)) as call:
        r = await call("memory.set_from_messages", w, namespace=ns, user_id="u9", messages=CHAT)
        body = r.json()
        assert body["extracted"] == 1 and [d["action"] for d in body["decisions"]] == ["add"]
        sent = [r.json["messages"][0]["content"] for r in standin.requests_to(standin.CHAT)]
        assert len(sent) == 2 and "living profile" in sent[1]  # one extraction call, then the profile
        texts = [
            f["text"] for f in (await call("memory.list", w, namespace=ns, user_id="u9")).json()["facts"]
        ]
        assert texts == ["Owns a sailboat"]  # the extracted fact that reads as high was dropped


async def test_the_fake_llm_stores_evidence_and_says_no_fact_was_extracted(call, ns, mint):
    w = mint(ns, "writer")
    r = await call("memory.set_from_messages", w, namespace=ns, user_id="u1", messages=CHAT)
    body = r.json()
    assert body["reason"] == "llm_not_configured" and body["extracted"] == 0 and body["decisions"] == []
    assert len(body["evidence_ids"]) == 3
    r = await call("memory.recall", w, namespace=ns, user_id="u1", query="Berlin")
    assert [h["content"] for h in r.json()["hits"]] == [CHAT[0]["content"]]
    r = await call("memory.recall", w, namespace=ns, user_id="u1", query="Lisbon")
    assert len(r.json()["hits"]) == 2 and all(h["score"] > 0 for h in r.json()["hits"])
    r = await call("memory.list", w, namespace=ns, user_id="u1")
    assert r.json()["facts"] == []


async def test_high_text_never_reaches_the_extractor_and_evidence_keeps_no_text(
    make_svc, standin, ns, mint, services
):
    w = mint(ns, "writer")
    model = Model(["Runs marathons"])
    standin.chat_reply = model
    msgs = [
        {"role": "user", "content": "I run marathons."},
        {"role": "user", "content": "the prod login is password=Tr0ub4dor&3xq", "msg_id": "secret"},
    ]
    async with api_over(_svc(make_svc, standin)) as call:
        r = await call("memory.set_from_messages", w, namespace=ns, user_id="u1", messages=msgs)
        assert r.json()["extracted"] == 1
    assert "Tr0ub4dor" not in model.extract_inputs[0] and "marathons" in model.extract_inputs[0]
    rows = services.ch.query(
        "SELECT content, high_sensitivity FROM memory_evidence FINAL WHERE namespace = {ns:String}"
        " AND msg_id = 'secret'",
        parameters={"ns": ns},
    ).result_rows
    assert rows == [("", True)]


async def test_works_with_recording_off_and_never_mines_recorded_turns(
    make_svc, standin, ns, mint, services, call, arq_worker
):
    w = mint(ns, "writer")
    # Recording on: a recorded turn is stored, and no fact or evidence comes of it.
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    standin.chat_reply = Model(
        ["Keeps bees"], lambda existing, new: [{"event": "ADD", "text": t} for t in new]
    )
    r = await call(
        "conversation.append",
        w,
        namespace=ns,
        thread_id="t1",
        role="user",
        user_id="u1",
        content="I keep bees on my roof in Lisbon.",
    )
    assert r.status_code == 200 and r.json()["stored"], r.text
    await asyncio.sleep(0.3)
    assert (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"] == []
    assert (await call("memory.recall", w, namespace=ns, user_id="u1", query="bees")).json()["hits"] == []
    assert standin.requests_to(standin.CHAT) == []  # nothing was sent to the extractor
    # Recording off: extraction still works, and memory set earlier stays.
    await call("memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Speaks Portuguese"}])
    namespaces.update(services.ch, ns, conversation_logging_enabled=False)
    await services.redis.delete(recording_cache.key(ns))
    async with api_over(_svc(make_svc, standin)) as scall:
        r = await scall(
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            messages=[{"role": "user", "content": "I keep bees on my roof."}],
        )
        assert r.json()["reason"] is None and r.json()["extracted"] == 1
    texts = {f["text"] for f in (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]}
    assert texts == {"Speaks Portuguese", "Keeps bees"}
    hits = (await call("memory.recall", w, namespace=ns, user_id="u1", query="bees")).json()["hits"]
    assert [h["content"] for h in hits] == ["I keep bees on my roof."]  # the evidence, not the recorded turn


async def test_a_malformed_reply_is_llm_failed_and_keeps_the_evidence(make_svc, standin, ns, mint):
    w = mint(ns, "writer")
    standin.chat_reply = "I would rather not answer in JSON"
    async with api_over(_svc(make_svc, standin)) as call:
        r = await call("memory.set_from_messages", w, namespace=ns, user_id="u1", messages=CHAT)
        assert r.status_code == 200 and r.json()["reason"] == "llm_failed"
        assert len((await call("memory.recall", w, namespace=ns, user_id="u1")).json()["hits"]) == 3
