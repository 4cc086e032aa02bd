"""bench/longmemeval_bench.py on its hand-written sample (LongMemEval's oracle layout),
against the session's real backends: sessions become evidence (and verbatim facts with
no LLM), memory.recall and search are scored by recall@k of the evidence sessions."""

from __future__ import annotations

import json

import pytest

from bench.studies import longmemeval as lme
from loom.auth.principal import Principal, Role

pytestmark = pytest.mark.timeout(120)


def test_the_sample_has_the_oracle_layout(monkeypatch) -> None:
    data = json.loads(lme.SAMPLE.read_text())
    keys = {
        "question_id",
        "question_type",
        "question",
        "answer",
        "question_date",
        "haystack_dates",
        "haystack_session_ids",
        "haystack_sessions",
        "answer_session_ids",
    }
    for raw in data:
        assert set(raw) == keys
        q = lme.Question.of(raw)
        assert q.answer_sessions <= set(q.sessions) and q.answer_turns

    def offline(name: str) -> None:
        raise OSError("no index")

    monkeypatch.setattr(lme, "dataset_path", offline)  # offline: the harness runs on the sample
    assert lme.find_oracle(None) == (lme.SAMPLE, False)
    assert lme.recall_at(["a", "a", "b", "c"], {"c"}, 2) == 0.0
    assert lme.recall_at(["a", "a", "b", "c"], {"c", "b"}, 3) == 1.0
    assert lme.recall_at(["a"], set(), 5) is None


async def test_the_harness_scores_recall_and_search(services, ns, monkeypatch) -> None:
    monkeypatch.setattr(lme, "NS", ns)
    who = Principal("bench", (ns,), Role.writer)
    questions = [lme.Question.of(x) for x in json.loads(lme.SAMPLE.read_text())]
    rows = []
    for q in questions:
        where = await lme.store_question(services, who, q)
        assert len(where) == sum(len(s) for s in q.sessions.values())
        rows.append(await lme.score_question(services, who, q, where))
    by_id = {r["qid"]: r for r in rows}
    # "What breed is my dog?" finds the dog session by BM25 over the evidence.
    assert by_id["sample_q1"]["recall_session@5"] == 1.0
    for r in rows:
        for key, value in r.items():
            if "@" in key and value is not None:
                assert 0.0 <= value <= 1.0, key
    assert any(r["search_session@10"] for r in rows)  # the verbatim facts are searched
    # memory.ask with the fake LLM: no answer, its ranked evidence is the basis.
    assert {r["ask_basis"] for r in rows} == {"context"}
    assert by_id["sample_q1"]["ask_session@5"] == 1.0
    lines = lme.report(rows, "sample", False)
    assert "SAMPLE" in lines[0] and any(line.startswith("memory.recall") for line in lines)
    assert any(line.startswith("memory.ask") for line in lines)


async def test_the_harness_scores_ask_answers_per_type(services, ns, monkeypatch) -> None:
    """With a configured model: memory.ask's citations are the basis, and accuracy is
    reported per question type for both answers."""
    import dataclasses
    import json as _json

    from loom.providers.llm import ChatMessage, ScriptedLLM

    def model(messages: list[ChatMessage]) -> str:
        system = messages[0].content
        if "extract durable facts" in system:
            return _json.dumps({"facts": []})
        if "answer a question about one user" in system:
            payload = _json.loads(messages[1].content)
            return _json.dumps(
                {"answer": "A golden retriever.", "citations": [e["id"] for e in payload["evidence"][:1]]}
            )
        if "correct answer" in system:
            return "yes" if "golden" in messages[1].content.lower() else "no"
        return "A golden retriever."

    svc = dataclasses.replace(services, llm=ScriptedLLM(model))
    monkeypatch.setattr(lme, "NS", ns)
    who = Principal("bench", (ns,), Role.writer)
    rows = []
    for q in [lme.Question.of(x) for x in json.loads(lme.SAMPLE.read_text())]:
        rows.append(await lme.score_question(svc, who, q, await lme.store_question(svc, who, q)))
    # A question sharing no content word with its sessions ("How many musical instruments
    # have I said I play?" against "cello", "ukulele") finds nothing with the fake embedder
    # once stop-words are dropped: no context, so no model call. Every other one is cited.
    answered = [r for r in rows if r["ask_reason"] != "no_context"]
    assert len(answered) >= 3 and {r["ask_basis"] for r in answered} == {"cited"}
    assert all(isinstance(r["ask_correct"], bool) for r in rows)
    lines = lme.report(rows, "sample", False)
    assert any("knowledge-update" in line for line in lines)
    assert any(line.startswith("answer accuracy (LLM judge), memory.ask") for line in lines)
