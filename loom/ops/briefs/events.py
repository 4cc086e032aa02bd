"""The events a save brings (what happened since the last save) and their windows.

An event is one line of the prompt: ``[kind] path (exit N): text``. Its size is that
line's length plus its newline, and a window holds whole lines up to
LOOM_SESSION_BRIEF_WINDOW_CHARS characters (a longer event is cut, head and tail kept,
to fit one window). Windows are packed in order; when a save has more than
LOOM_SESSION_BRIEF_MAX_WINDOWS of them the newest are revised and the oldest events are
left out (reported as ``events_dropped``): the brief is state, and the newest events
say most about the state now.

Events whose text or path reads as high sensitivity are withheld before anything else:
they are never put in a prompt, never read by the deterministic builder, and a summary
event that reads as high is never kept as the client's summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loom.errors import InvalidRequest
from loom.limits import MAX_EVENT_CHARS, MAX_EVENTS, MAX_PATH_CHARS

KINDS = ("user", "assistant", "edit", "command", "error", "read", "search", "tool", "note", "summary")


@dataclass(frozen=True)
class Event:
    kind: str
    text: str = ""
    path: str = ""
    exit_code: int | None = None

    def line(self) -> str:
        head = f"[{self.kind}]"
        if self.path:
            head += f" {self.path}"
        if self.exit_code is not None:
            head += f" (exit {self.exit_code})"
        text = " ".join(self.text.split("\n")) if self.kind not in ("summary", "note") else self.text
        return f"{head}: {text}" if text else head


def check_events(events: Sequence[Event]) -> None:
    """The op-level bounds (the API model checks the same, field by field)."""
    if len(events) > MAX_EVENTS:
        raise InvalidRequest(
            f"at most {MAX_EVENTS} events per save, got {len(events)}", field="events", rule="max_items"
        )
    for i, ev in enumerate(events):
        if ev.kind not in KINDS:
            raise InvalidRequest(
                f"event kind must be one of {', '.join(KINDS)}", field=f"events.{i}.kind", rule="enum"
            )
        if len(ev.text) > MAX_EVENT_CHARS:
            raise InvalidRequest(
                f"an event's text is at most {MAX_EVENT_CHARS} characters",
                field=f"events.{i}.text",
                rule="max_length",
            )
        if len(ev.path) > MAX_PATH_CHARS:
            raise InvalidRequest(
                f"an event's path is at most {MAX_PATH_CHARS} characters",
                field=f"events.{i}.path",
                rule="max_length",
            )


def withhold_high(events: Sequence[Event], reads_as_high: Callable[[str], bool]) -> tuple[list[Event], int]:
    """The events that may be read, and how many were withheld as high sensitivity."""
    kept: list[Event] = []
    withheld = 0
    for ev in events:
        if (ev.text and reads_as_high(ev.text)) or (ev.path and reads_as_high(ev.path)):
            withheld += 1
            continue
        kept.append(ev)
    return kept, withheld


def last_summary(events: Sequence[Event]) -> str | None:
    """The text of the last ``summary`` event (already filtered for sensitivity), if any."""
    for ev in reversed(events):
        if ev.kind == "summary" and ev.text.strip():
            return ev.text
    return None


def _fit(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    marker = " … "
    keep = max(0, limit - len(marker))
    head = keep * 2 // 3
    return line[:head] + marker + line[len(line) - (keep - head) :]


@dataclass
class Window:
    lines: list[str] = field(default_factory=list)
    chars: int = 0
    events: int = 0

    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class WindowPlan:
    windows: list[Window]  # the windows to revise, oldest first
    total_windows: int  # how many the events filled before the cap
    events_dropped: int  # events in the windows beyond the cap (the oldest)


def plan_windows(events: Sequence[Event], window_chars: int, max_windows: int) -> WindowPlan:
    windows: list[Window] = []
    current = Window()
    for ev in events:
        line = _fit(ev.line(), window_chars - 1)
        size = len(line) + 1
        if current.lines and current.chars + size > window_chars:
            windows.append(current)
            current = Window()
        current.lines.append(line)
        current.chars += size
        current.events += 1
    if current.lines:
        windows.append(current)
    total = len(windows)
    if total <= max_windows:
        return WindowPlan(windows, total, 0)
    dropped = windows[: total - max_windows]
    return WindowPlan(windows[total - max_windows :], total, sum(w.events for w in dropped))
