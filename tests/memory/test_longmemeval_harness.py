"""bench/longmemeval_bench.py on its hand-written sample (LongMemEval's oracle layout),
against the session's real backends: sessions become evidence (and verbatim facts with
no LLM), memory.recall and search are scored by recall@k of the evidence sessions."""

from __future__ import annotations

import json

import pytest

from bench import longmemeval_bench as lme
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
    lines = lme.report(rows, "sample", False)
    assert "SAMPLE" in lines[0] and any(line.startswith("memory.recall") for line in lines)
