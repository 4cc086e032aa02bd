"""The brief's sections: accumulate vs replace, caps (oldest fall off), the render bound."""

from __future__ import annotations

from loom.ops.briefs.model import (
    LIST_CAPS,
    MAX_RENDERED_CHARS,
    Patch,
    Sections,
    apply,
    bounded,
    headline,
    render,
    sections_patch,
)


def test_state_replaced_and_accumulating_appended() -> None:
    base = apply(
        Sections(),
        sections_patch(
            {
                "goal": "Add retries",
                "status": "started",
                "decisions": ["use tenacity"],
                "dead_ends": ["urllib3 Retry: no jitter"],
                "done": ["read client"],
                "next_steps": ["write test"],
                "key_files": ["a.py"],
                "constraints": ["py3.11"],
                "pointers": ["PR #1"],
                "open_questions": ["q1"],
            }
        ),
    )
    later = apply(
        base,
        sections_patch(
            {
                "status": "tests pass",
                "decisions": ["cap at 5 attempts"],
                "done": ["wrote retry"],
                "next_steps": ["open PR"],
                "key_files": ["b.py"],
            }
        ),
    )
    assert later.goal == "Add retries"  # not named: unchanged
    assert later.status == "tests pass"  # replaced
    assert later.next_steps == ["open PR"] and later.key_files == ["b.py"]  # replaced
    assert later.decisions == ["use tenacity", "cap at 5 attempts"]  # accumulated
    assert later.done == ["read client", "wrote retry"]
    assert later.dead_ends == ["urllib3 Retry: no jitter"]
    assert later.constraints == ["py3.11"] and later.pointers == ["PR #1"] and later.open_questions == ["q1"]


def test_accumulated_items_are_not_doubled() -> None:
    s = apply(Sections(decisions=["Use X"]), Patch(added={"decisions": ["use x ", "Use Y"]}))
    assert s.decisions == ["use x", "Use Y"]


def test_caps_keep_the_newest() -> None:
    s = Sections()
    for i in range(30):
        s = apply(s, Patch(added={"decisions": [f"decision {i}"], "dead_ends": [f"dead end {i}"]}))
    s = apply(s, Patch(state={"next_steps": [f"step {i}" for i in range(15)]}))
    assert len(s.decisions) == 20 == LIST_CAPS["decisions"].items
    assert s.decisions[0] == "decision 10" and s.decisions[-1] == "decision 29"
    assert len(s.dead_ends) == 12 and s.dead_ends[0] == "dead end 18"
    assert len(s.next_steps) == 8 and s.next_steps[-1] == "step 14"


def test_rendered_brief_stays_under_12000_chars() -> None:
    huge = Sections(
        goal="g" * 5000,
        status="s\n" * 5000,
        **{name: [f"{name} {i} " + "x" * 1000 for i in range(60)] for name in LIST_CAPS},
    )
    b = bounded(huge)
    text = render(b, key="~user-123~session-456~" + "k" * 160, revision=123456)
    assert len(text) < MAX_RENDERED_CHARS
    for name, cap in LIST_CAPS.items():
        items = getattr(b, name)
        assert 0 < len(items) <= cap.items
        assert all(len(i) <= cap.item_chars for i in items)
        assert items[-1].startswith(f"{name} 59")  # newest kept
    assert len(b.goal) <= 500


def test_render_and_headline() -> None:
    s = apply(Sections(), sections_patch({"goal": "Ship\nbriefs", "next_steps": ["a", "b"]}))
    text = render(s, key="auto/loom/main", revision=3)
    assert text.startswith("# Session brief: auto/loom/main (revision 3)")
    assert "## Goal\nShip briefs" in text and "## Next steps\n- a\n- b" in text
    assert "## Decisions" not in text  # empty sections left out
    assert headline(s) == "Ship briefs"
    assert headline(Sections(status="first\nsecond")) == "first"


def test_a_headline_that_reads_as_high_is_empty() -> None:
    """A listing line is an excerpt: it reaches session primers and the dashboard."""
    assert headline(Sections(goal="rotate the key: password=Tr0ub4dor&3xq")) == ""
    assert headline(Sections(status="my SSN is 123-45-6789\nthen ship")) == ""
    # Judged on what it shows and 1,024 characters past it, as thread excerpts are.
    assert headline(Sections(goal="x" * 2000 + " password=Tr0ub4dor&3xq")) == "x" * 119 + "…"


def test_json_round_trip() -> None:
    s = apply(Sections(), sections_patch({"goal": "g", "decisions": ["d"], "pointers": ["p"]}))
    assert Sections.from_json(s.to_json()) == s
    assert Sections.from_json("not json") == Sections()
