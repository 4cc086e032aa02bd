"""The deterministic builder on a realistic coding session."""

from __future__ import annotations

from loom.ops.briefs.builder import build
from loom.ops.briefs.events import Event
from loom.ops.briefs.model import Sections, apply, render

SESSION = [
    Event(
        "user",
        "The upload client drops files on flaky networks. Add retries with backoff to "
        "loom/sdk/upload.py and make the test suite cover it.",
    ),
    Event("assistant", "I'll look at the upload client and its tests first."),
    Event("read", "", path="loom/sdk/upload.py"),
    Event("read", "", path="tests/sdk/test_upload.py"),
    Event("search", "grep -rn 'def upload' loom/"),
    Event("edit", "wrap _send in a retry loop with exponential backoff", path="loom/sdk/upload.py"),
    Event("command", ".venv/bin/pytest tests/sdk/test_upload.py -q", exit_code=1),
    Event("error", "AssertionError: expected 3 attempts, got 1", path="tests/sdk/test_upload.py"),
    Event("edit", "count attempts in the fake transport", path="tests/sdk/test_upload.py"),
    Event("edit", "honour Retry-After", path="loom/sdk/upload.py"),
    Event("command", ".venv/bin/pytest tests/sdk/test_upload.py -q", exit_code=0),
    Event("tool", "web_fetch https://datatracker.ietf.org/doc/html/rfc9110#name-retry-after."),
    Event("command", "ruff check loom/sdk", exit_code=1),
    Event(
        "error",
        "loom/sdk/upload.py:41:5: F841 local variable 'delay' is assigned to but never used",
        path="loom/sdk/upload.py",
    ),
    Event(
        "assistant",
        "Retries with backoff and Retry-After are in; tests pass. One ruff warning is left "
        "in upload.py. See https://github.com/acme/loom/pull/42 for the draft PR.",
    ),
]


def test_realistic_coding_session() -> None:
    patch = build(Sections(), SESSION)
    assert not patch.added  # never decisions, dead ends or done items
    assert set(patch.state) == {"goal", "status", "key_files", "pointers"}
    brief = apply(Sections(), patch)
    assert brief.goal.startswith("The upload client drops files on flaky networks.")
    status = brief.status.splitlines()
    assert status[0].startswith("Latest: Retries with backoff and Retry-After are in; tests pass.")
    assert status[1] == ("This save: 15 events, 3 edits to 2 files, 3 commands (2 failed), 2 errors.")
    assert status[2] == "Last command: ruff check loom/sdk (exit 1)"
    assert status[3] == "Open errors (after the last passing command):"
    assert "`ruff check loom/sdk` failed (exit 1)" in status[4]
    assert "F841 local variable 'delay'" in status[5]
    assert "expected 3 attempts" not in brief.status  # fixed before the passing run
    # key files: read first, edited last (newest last)
    assert brief.key_files == ["tests/sdk/test_upload.py", "loom/sdk/upload.py"]
    assert brief.pointers == [
        "https://datatracker.ietf.org/doc/html/rfc9110#name-retry-after",
        "https://github.com/acme/loom/pull/42",
    ]
    assert brief.decisions == brief.dead_ends == brief.done == []
    text = render(brief, key="auto/loom/retries", revision=1)
    assert "## Key files\n- tests/sdk/test_upload.py\n- loom/sdk/upload.py" in text


def test_builder_carries_what_it_cannot_judge() -> None:
    base = Sections(
        goal="Ship retries",
        key_files=["old.py"],
        pointers=["https://x.test/a"],
        next_steps=["open PR"],
        decisions=["use backoff"],
    )
    brief = apply(
        base,
        build(base, [Event("user", "now also handle timeouts please"), Event("edit", "", path="new.py")]),
    )
    assert brief.goal == "Ship retries"
    assert brief.key_files == ["old.py", "new.py"] and brief.pointers == ["https://x.test/a"]
    assert brief.next_steps == ["open PR"] and brief.decisions == ["use backoff"]
    assert brief.status.splitlines()[0] == "This save: 2 events, 1 edit to 1 file."
