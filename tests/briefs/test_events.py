"""Events: windows (count, cap, long events), the sensitivity screen, the summary."""

from __future__ import annotations

import pytest

from loom.errors import InvalidRequest
from loom.ops.briefs.events import Event, check_events, last_summary, plan_windows, withhold_high
from loom.sensitivity import reads_as_high


def sized(n: int, size: int = 100) -> list[Event]:
    """n events whose rendered line plus newline is exactly `size` characters."""
    head = len("[note]: ") + 1
    return [Event("note", f"{i:05d}" + "x" * (size - head - 5)) for i in range(n)]


def test_window_count_for_two_and_a_half_windows() -> None:
    events = sized(50)  # 5,000 characters
    assert sum(len(e.line()) + 1 for e in events) == 5_000
    plan = plan_windows(events, 2_000, 4)
    assert plan.total_windows == 3 and len(plan.windows) == 3 and plan.events_dropped == 0
    assert [w.events for w in plan.windows] == [20, 20, 10]
    assert all(w.chars <= 2_000 for w in plan.windows)


def test_windows_capped_newest_kept() -> None:
    plan = plan_windows(sized(100), 2_000, 2)  # 10,000 characters = 5 windows
    assert plan.total_windows == 5 and len(plan.windows) == 2
    assert plan.events_dropped == 60
    assert plan.windows[0].lines[0].startswith("[note]: 00060")
    assert plan.windows[-1].lines[-1].startswith("[note]: 00099")


def test_an_event_longer_than_a_window_is_cut_to_fit() -> None:
    long = Event("assistant", "head " + "y" * 10_000 + " tail")
    plan = plan_windows([Event("user", "hi"), long], 2_000, 4)
    assert plan.total_windows == 2
    line = plan.windows[1].lines[0]
    assert len(line) < 2_000 and line.startswith("[assistant]: head") and line.endswith("tail")


def test_high_sensitivity_events_are_withheld() -> None:
    events = [
        Event("user", "fix the flaky test"),
        Event("command", "export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"),
        Event("note", "password=s3cr3tP4ss"),
        Event("summary", "my PIN is 4821"),
        Event("summary", "we refactored the retry loop"),
    ]
    assert [reads_as_high(e.text) for e in events] == [False, True, True, True, False]
    kept, withheld = withhold_high(events, reads_as_high)
    assert withheld == 3 and [e.text for e in kept] == ["fix the flaky test", "we refactored the retry loop"]
    assert last_summary(kept) == "we refactored the retry loop"


def test_check_events() -> None:
    with pytest.raises(InvalidRequest) as exc:
        check_events([Event("note", "x")] * 4_001)
    assert exc.value.field == "events"
    with pytest.raises(InvalidRequest) as exc:
        check_events([Event("note", "x"), Event("bogus", "y")])
    assert exc.value.field == "events.1.kind"
