"""The deterministic builder: a brief from events without a model.

It writes what can be read off the events without judgement: the goal (the first user
message, only while the brief has none), the status (the assistant's latest word, the
activity of this save, the last command and the errors still open after it), the key
files (read, then edited, newest last, carried forward with the earlier ones) and
pointers (URLs seen, carried forward). It never writes decisions, dead ends, done
items, open questions, next steps or constraints: those need judgement.

It is only ever given events that passed the sensitivity check (see events.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from loom.ops.briefs.events import Event
from loom.ops.briefs.model import Patch, Sections, clip, one_line

_URL = re.compile(r"https?://[^\s<>()\[\]{}\"'`]+")
_TRAILING = ".,;:!?"


def _first_sentence(text: str, limit: int) -> str:
    flat = one_line(text)
    return clip(flat, limit)


def _urls(text: str) -> list[str]:
    return [m.group(0).rstrip(_TRAILING) for m in _URL.finditer(text)]


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _is_failed(ev: Event) -> bool:
    return ev.kind == "error" or (ev.kind == "command" and ev.exit_code not in (None, 0))


def build(base: Sections, events: Sequence[Event]) -> Patch:
    """The patch for ``base`` from ``events`` (state sections only)."""
    state: dict[str, object] = {}
    if not events:
        return Patch()

    if not base.goal:
        for ev in events:
            if ev.kind == "user" and len(one_line(ev.text)) >= 8:
                state["goal"] = _first_sentence(ev.text, 300)
                break

    # Status.
    lines: list[str] = []
    last_assistant = next((ev for ev in reversed(events) if ev.kind == "assistant" and ev.text.strip()), None)
    last_summary = next((ev for ev in reversed(events) if ev.kind == "summary" and ev.text.strip()), None)
    if last_assistant is not None:
        lines.append("Latest: " + _first_sentence(last_assistant.text, 320))
    elif last_summary is not None:
        lines.append("Latest summary: " + _first_sentence(last_summary.text, 320))

    edits = [ev for ev in events if ev.kind == "edit"]
    commands = [ev for ev in events if ev.kind == "command"]
    failed_cmds = [ev for ev in commands if ev.exit_code not in (None, 0)]
    errors = [ev for ev in events if ev.kind == "error"]
    edited_files = {ev.path for ev in edits if ev.path}
    parts = [_n(len(events), "event")]
    if edits:
        parts.append(f"{_n(len(edits), 'edit')} to {_n(len(edited_files), 'file')}")
    if commands:
        parts.append(f"{_n(len(commands), 'command')} ({len(failed_cmds)} failed)")
    if errors:
        parts.append(_n(len(errors), "error"))
    lines.append("This save: " + ", ".join(parts) + ".")

    if commands:
        last_cmd = commands[-1]
        code = "" if last_cmd.exit_code is None else f" (exit {last_cmd.exit_code})"
        lines.append(f"Last command: {clip(one_line(last_cmd.text), 160)}{code}")

    last_ok = max(
        (i for i, ev in enumerate(events) if ev.kind == "command" and ev.exit_code == 0), default=-1
    )
    open_errors = [ev for i, ev in enumerate(events) if i > last_ok and _is_failed(ev)]
    if open_errors:
        lines.append("Open errors (after the last passing command):")
        for ev in open_errors[-3:]:
            where = f"{ev.path}: " if ev.path else ""
            what = ev.text if ev.kind == "error" else f"`{one_line(ev.text)}` failed (exit {ev.exit_code})"
            lines.append(f"- {where}{clip(one_line(what), 200)}")
    elif errors or failed_cmds:
        lines.append("Errors this save were followed by a passing command.")
    state["status"] = "\n".join(lines)

    # Key files: earlier ones carried, then read, then edited (newest last).
    read = [ev.path for ev in events if ev.kind == "read" and ev.path]
    edited = [ev.path for ev in edits if ev.path]
    touched = read + edited
    if touched:
        state["key_files"] = [*base.key_files, *read, *edited]

    urls = [u for ev in events if ev.kind != "summary" for u in _urls(ev.text)]
    if urls:
        state["pointers"] = [*base.pointers, *urls]
    return Patch(state, {})
