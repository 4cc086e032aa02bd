"""memory.ask over the real OpenAI-compatible provider against the local stand-in chat
server: citations mapped to real fact and evidence ids, the time basis, as_of; and the
paths with no answer (the fake LLM, a failing model, a high answer, no context, model
calls switched off), each with the ranked context."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from loom.providers.llm import build_llm
from loom.store import namespaces
from tests.memory.conftest import api_over
from tests.providers.standin import RecordedRequest, Reply, StandInServer

pytestmark = pytest.mark.timeout(90)
QUESTION = "Does the user live in Lisbon?"


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        yield srv


class Model:
    """The stand-in's answer: cites the items whose text holds `needle` (and an id it
    made up); records what it was sent."""

    def __init__(self, needle: str = "Lisbon", answer: str = "They live in Lisbon.") -> None:
        self.needle, self.answer = needle, answer
        self.sent: list[dict[str, Any]] = []

    def __call__(self, req: RecordedRequest) -> str:
        payload = json.loads(req.json["messages"][1]["content"])
        self.sent.append(payload)
        cited = [i["id"] for i in payload["facts"] + payload["evidence"] if self.needle in i["text"]]
        return json.dumps({"answer": self.answer, "citations": [*cited, "F99"]})


async def _seed(call: Any, w: str, ns: str, user: str = "u1") -> dict[str, Any]:
    """Two facts and three messages (one said before 2026-03, two after). The suite's fake
    LLM stores the messages as evidence and extracts nothing."""
    r = await call(
        "memory.set",
        w,
        namespace=ns,
        user_id=user,
        facts=[{"text": "Lives in Lisbon"}, {"text": "Is vegetarian"}],
    )
    assert r.status_code == 200, r.text
    r = await call(
        "memory.set_from_messages",
        w,
        namespace=ns,
        user_id=user,
        messages=[
            {"role": "user", "content": "I live in Berlin, near the river.", "ts": "2026-01-10T09:00:00Z"},
            {"role": "user", "content": "I moved to Lisbon last month.", "ts": "2026-05-02T09:00:00Z"},
            {"role": "assistant", "content": "How is Lisbon treating you?", "ts": "2026-05-02T09:00:01Z"},
        ],
    )
    assert r.status_code == 200 and r.json()["reason"] == "llm_not_configured", r.text
    facts = (await call("memory.list", w, namespace=ns, user_id=user)).json()["facts"]
    return {"facts": {f["text"]: f for f in facts}, "evidence": r.json()["evidence_ids"]}


def _svc(services: Any, srv: StandInServer) -> Any:
    import dataclasses

    return dataclasses.replace(
        services, llm=build_llm("openai", base_url=srv.url, api_key="k", model="m", timeout=5.0)
    )


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


async def test_an_answer_cites_real_ids_with_its_time_basis(call, ns, mint, services, standin):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    seeded = await _seed(call, w, ns)
    model = Model()
    standin.chat_reply = model
    async with api_over(_svc(services, standin)) as ask_call:
        r = await ask_call("memory.ask", v, namespace=ns, user_id="u1", question=QUESTION)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["answer"] == "They live in Lisbon." and got["reason"] is None
    lisbon = seeded["facts"]["Lives in Lisbon"]
    said = [e for e in got["evidence"] if "Lisbon" in e["content"]]
    assert len(said) == 2 and {e["evidence_id"] for e in said} <= set(seeded["evidence"])
    # Every citation is a real id of the context; the made-up F99 is dropped.
    assert {(c["kind"], c["id"]) for c in got["citations"]} == {("fact", lisbon["memory_id"])} | {
        ("evidence", e["evidence_id"]) for e in said
    }
    # The time basis: the newest cited time (the fact, set just now, is newer than the messages).
    assert _t(got["time_basis"]["newest"]) == max(_t(c["time"]) for c in got["citations"])
    assert _t(got["time_basis"]["newest"]) == _t(lisbon["updated_at"])
    assert got["time_basis"]["as_of"] is None
    # The model saw the question, short ids (never Loom's) and the texts.
    sent = model.sent[0]
    assert sent["question"] == QUESTION and all(f["id"].startswith("F") for f in sent["facts"])
    assert lisbon["memory_id"] not in json.dumps(sent)
    assert {f["text"] for f in sent["facts"]} >= {"Lives in Lisbon"}


async def test_as_of_bounds_the_context_and_is_echoed(call, ns, mint, services, standin):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    seeded = await _seed(call, w, ns)
    model = Model(needle="Berlin", answer="In March 2026 they lived in Berlin.")
    standin.chat_reply = model
    async with api_over(_svc(services, standin)) as ask_call:
        r = await ask_call(
            "memory.ask",
            v,
            namespace=ns,
            user_id="u1",
            question="Where did the user live?",
            as_of="2026-03-01T00:00:00Z",
        )
    got = r.json()
    assert r.status_code == 200 and got["answer"].endswith("Berlin."), r.text
    # Only what was said by then, and no fact set after it.
    assert [e["content"] for e in got["evidence"]] == ["I live in Berlin, near the river."]
    assert got["facts"] == []
    assert [c["kind"] for c in got["citations"]] == ["evidence"] and got["citations"][0]["id"] in seeded[
        "evidence"
    ]
    assert _t(got["time_basis"]["newest"]) == datetime(2026, 1, 10, 9, tzinfo=UTC)
    assert _t(got["time_basis"]["as_of"]) == datetime(2026, 3, 1, tzinfo=UTC)
    assert model.sent[0]["as_of"].startswith("2026-03-01")


async def test_the_fake_llm_answers_the_ranked_context_and_says_so(call, ns, mint):
    w = mint(ns, "writer")
    seeded = await _seed(call, w, ns)
    mine = mint(ns, "viewer", "own_user", "u1")  # an end-user token asks about itself
    r = await call("memory.ask", mine, namespace="@me", question=QUESTION)
    got = r.json()
    assert r.status_code == 200 and got["answer"] is None and got["reason"] == "llm_not_configured"
    assert got["citations"] == []
    assert got["facts"][0]["memory_id"] == seeded["facts"]["Lives in Lisbon"]["memory_id"]
    assert got["facts"][0]["score"] >= got["facts"][-1]["score"]
    assert got["evidence"] and all(
        "Lisbon" in e["content"] or "live" in e["content"] for e in got["evidence"]
    )
    # The basis of a context nothing cites: its newest item.
    newest = max([_t(f["updated_at"]) for f in got["facts"]] + [_t(e["ts"]) for e in got["evidence"]])
    assert _t(got["time_basis"]["newest"]) == newest
    r = await call("memory.ask", mine, namespace=ns, user_id="u2", question=QUESTION)
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    r = await call("memory.ask", mint(ns, "viewer"), namespace=ns, question=QUESTION)
    assert r.status_code == 422 and r.json()["field"] == "user_id"
    r = await call("memory.ask", mint(ns, "viewer"), namespace=ns, user_id="u1", question="")
    assert r.status_code == 422 and r.json()["field"] == "question"


async def test_no_answer_paths_keep_the_context(call, ns, mint, services, standin):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    await _seed(call, w, ns)
    async with api_over(_svc(services, standin)) as ask_call:

        async def ask(**body: Any) -> dict[str, Any]:
            r = await ask_call(
                "memory.ask", v, namespace=ns, **{"user_id": "u1", "question": QUESTION, **body}
            )
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        standin.enqueue(standin.CHAT, Reply.error(500, "the model fell over at 10.0.0.7"))
        got = await ask()
        assert got["reason"] == "llm_failed" and got["answer"] is None and got["facts"]
        assert "10.0.0.7" not in json.dumps(got)
        standin.enqueue(standin.CHAT, standin.chat_ok("no json here"))
        assert (await ask())["reason"] == "llm_failed"
        standin.enqueue(
            standin.CHAT,
            standin.chat_ok(json.dumps({"answer": "my SSN is 123-45-6789", "citations": ["F1"]})),
        )
        got = await ask()
        assert got["reason"] == "answer_high_sensitivity" and got["answer"] is None and got["citations"] == []
        calls = len(standin.requests_to(standin.CHAT))
        got = await ask(user_id="nobody")
        assert got["reason"] == "no_context" and got["facts"] == [] and got["evidence"] == []
        got = await ask(question="my PIN is 4821, where do I live?")
        assert (
            got["reason"] == "question_high_sensitivity"
            and got["fallback_reason"] == "query_high_sensitivity"
        )
        namespaces.update(services.ch, ns, model_calls_enabled=False)
        got = await ask()
        assert got["reason"] == "model_calls_disabled" and got["facts"]
        assert len(standin.requests_to(standin.CHAT)) == calls  # none of these called the model
