"""The model's output contract: what parses, what fails the window; the prompt."""

from __future__ import annotations

import json

import pytest

from loom.ops.briefs.llm import SYSTEM_PROMPT, ReplyError, messages_for, parse_reply
from loom.ops.briefs.model import Sections

GOOD = {
    "goal": "Add retries",
    "status": "tests pass",
    "next_steps": ["open PR"],
    "key_files": ["a.py"],
    "open_questions": [],
    "constraints": ["py3.11"],
    "pointers": [],
    "new_decisions": ["cap at 5"],
    "new_dead_ends": [],
    "new_done": ["retry loop"],
}


def test_good_answer() -> None:
    p = parse_reply(json.dumps(GOOD))
    assert p.state["goal"] == "Add retries" and p.state["next_steps"] == ["open PR"]
    assert p.state["open_questions"] == []  # present and empty: replaces with nothing
    assert p.added == {"decisions": ["cap at 5"], "done": ["retry loop"]}


@pytest.mark.parametrize("wrap", ["```json\n{}\n```", "Here is the brief:\n{}\nDone.", "  {}  "])
def test_fenced_or_wrapped_answer(wrap: str) -> None:
    p = parse_reply(wrap.replace("{}", json.dumps(GOOD)))
    assert p.state["status"] == "tests pass"


def test_missing_keys_leave_sections_alone() -> None:
    p = parse_reply('{"status": "halfway"}')
    assert p.state == {"status": "halfway"} and not p.added


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "no json here",
        "[1, 2]",
        '{"goal": "x"',
        '{"unrelated": 1}',
        '{"goal": 5}',
        '{"next_steps": "one string"}',
        '{"new_decisions": [{"x": 1}]}',
        "null",
    ],
)
def test_off_contract_answers_fail(bad: str) -> None:
    with pytest.raises(ReplyError):
        parse_reply(bad)


def test_prompt_names_the_contract_and_carries_brief_and_window() -> None:
    msgs = messages_for(Sections(goal="G1"), "[user]: hello", 2, 3)
    assert (
        msgs[0].role == "system" and "new_decisions" in SYSTEM_PROMPT and "ONE JSON object" in SYSTEM_PROMPT
    )
    assert '"goal": "G1"' in msgs[1].content and "window 2 of 3" in msgs[1].content
    assert "[user]: hello" in msgs[1].content
