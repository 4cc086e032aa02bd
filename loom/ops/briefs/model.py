"""The brief itself: its sections, their caps, how a revision applies, how it renders.

Sections:

* state, replaced by each revision that names them: ``goal``, ``status`` (text) and
  ``open_questions``, ``next_steps``, ``key_files``, ``constraints``, ``pointers`` (lists);
* accumulating, only ever appended to: ``decisions``, ``dead_ends``, ``done``.

Every list is kept oldest first, and every cap keeps the newest items: the oldest fall
off first. Caps are per section (item count, characters per item, characters for the
whole section), chosen so that a rendered brief of a maximal key stays under
:data:`MAX_RENDERED_CHARS` (about 12,000 characters); :func:`bounded` enforces them and a
final check trims the oldest accumulated items should the sum ever exceed it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.sensitivity import window_reads_as_high

MAX_RENDERED_CHARS = 12_000

TEXT_SECTIONS = ("goal", "status")
STATE_LISTS = ("open_questions", "next_steps", "key_files", "constraints", "pointers")
ACCUMULATING = ("decisions", "dead_ends", "done")
LIST_SECTIONS = ACCUMULATING + STATE_LISTS
STATE_SECTIONS = TEXT_SECTIONS + STATE_LISTS
SECTION_ORDER = (
    "goal",
    "status",
    "decisions",
    "dead_ends",
    "done",
    "open_questions",
    "next_steps",
    "key_files",
    "constraints",
    "pointers",
)

TITLES = {
    "goal": "Goal",
    "status": "Status",
    "decisions": "Decisions",
    "dead_ends": "Dead ends",
    "done": "Done",
    "open_questions": "Open questions",
    "next_steps": "Next steps",
    "key_files": "Key files",
    "constraints": "Constraints",
    "pointers": "Pointers",
}


@dataclass(frozen=True)
class ListCap:
    items: int  # at most this many items (newest kept)
    item_chars: int  # each item cut to this many characters
    total_chars: int  # the section's items together (newest kept)


TEXT_CAPS: dict[str, int] = {"goal": 500, "status": 1_200}
LIST_CAPS: dict[str, ListCap] = {
    "decisions": ListCap(20, 300, 2_200),
    "dead_ends": ListCap(12, 300, 1_400),
    "done": ListCap(20, 200, 1_400),
    "open_questions": ListCap(8, 250, 800),
    "next_steps": ListCap(8, 250, 900),
    "key_files": ListCap(20, 200, 1_000),
    "constraints": ListCap(10, 250, 800),
    "pointers": ListCap(12, 250, 800),
}

_WS = re.compile(r"\s+")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marked with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)].rstrip() + "…"


def one_line(text: str) -> str:
    return _WS.sub(" ", text).strip()


def _clean_text(section: str, value: str) -> str:
    if section == "goal":
        return clip(one_line(value), TEXT_CAPS[section])
    lines = [ln.rstrip() for ln in value.strip().splitlines()]
    out = "\n".join(ln for ln in lines if ln.strip())
    return clip(out, TEXT_CAPS[section])


def _norm(item: str) -> str:
    return one_line(item).casefold()


def _clean_list(section: str, items: Iterable[str]) -> list[str]:
    """Cleaned, de-duplicated (the later copy wins its place) and capped, newest kept."""
    cap = LIST_CAPS[section]
    seen: set[str] = set()
    rev: list[str] = []
    for raw in reversed(list(items)):
        item = clip(one_line(raw), cap.item_chars)
        key = item.casefold()
        if not item or key in seen:
            continue
        seen.add(key)
        rev.append(item)
    kept: list[str] = []
    used = 0
    for item in rev:  # newest first
        if len(kept) >= cap.items or used + len(item) > cap.total_chars:
            break
        kept.append(item)
        used += len(item)
    kept.reverse()
    return kept


@dataclass
class Sections:
    goal: str = ""
    status: str = ""
    decisions: list[str] = field(default_factory=list)
    dead_ends: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    open_questions: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    key_files: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    pointers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            name: (list(getattr(self, name)) if name in LIST_SECTIONS else getattr(self, name))
            for name in SECTION_ORDER
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sections:
        out = cls()
        for name in TEXT_SECTIONS:
            value = data.get(name)
            if isinstance(value, str):
                setattr(out, name, value)
        for name in LIST_SECTIONS:
            value = data.get(name)
            if isinstance(value, list):
                setattr(out, name, [str(v) for v in value if isinstance(v, str)])
        return out

    @classmethod
    def from_json(cls, text: str) -> Sections:
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        return cls.from_dict(data) if isinstance(data, dict) else cls()

    def copy(self) -> Sections:
        return Sections.from_dict(self.to_dict())

    def is_empty(self) -> bool:
        return not any(getattr(self, name) for name in SECTION_ORDER)


@dataclass
class Patch:
    """What one revision changes: state sections it replaces, items it appends."""

    state: dict[str, Any] = field(default_factory=dict)  # section -> str | list[str]
    added: dict[str, list[str]] = field(default_factory=dict)  # accumulating section -> new items

    def is_empty(self) -> bool:
        return not self.state and not any(self.added.values())

    def then(self, later: Patch) -> Patch:
        """This patch followed by ``later``: later state wins, additions concatenate."""
        state = {**self.state, **later.state}
        added = {name: [*self.added.get(name, []), *later.added.get(name, [])] for name in ACCUMULATING}
        return Patch(state, {k: v for k, v in added.items() if v})


def apply(base: Sections, patch: Patch) -> Sections:
    """``base`` with ``patch`` applied, bounded."""
    out = base.copy()
    for name, value in patch.state.items():
        if name in TEXT_SECTIONS:
            setattr(out, name, str(value))
        elif name in STATE_LISTS:
            setattr(out, name, [str(v) for v in value])
    for name in ACCUMULATING:
        new = patch.added.get(name) or []
        if new:
            setattr(out, name, [*getattr(out, name), *new])
    return bounded(out)


def bounded(sections: Sections) -> Sections:
    """Every cap applied; the rendering of any key stays under MAX_RENDERED_CHARS."""
    out = Sections()
    for name in TEXT_SECTIONS:
        setattr(out, name, _clean_text(name, getattr(sections, name)))
    for name in LIST_SECTIONS:
        setattr(out, name, _clean_list(name, getattr(sections, name)))
    # The caps above already guarantee the bound; this is the belt to their braces.
    while len(render(out, key="k" * 200, revision=10**9)) > MAX_RENDERED_CHARS:
        longest = max(ACCUMULATING + STATE_LISTS, key=lambda n: sum(map(len, getattr(out, n))))
        items = getattr(out, longest)
        if not items:
            out.status = clip(out.status, max(0, len(out.status) // 2))
            continue
        setattr(out, longest, items[1:])
    return out


def render(sections: Sections, *, key: str = "", revision: int | None = None) -> str:
    """The brief as Markdown, empty sections left out."""
    parts: list[str] = []
    if key:
        title = f"# Session brief: {key}"
        if revision is not None:
            title += f" (revision {revision})"
        parts.append(title)
    for name in SECTION_ORDER:
        value = getattr(sections, name)
        if not value:
            continue
        body = value if isinstance(value, str) else "\n".join(f"- {item}" for item in value)
        parts.append(f"## {TITLES[name]}\n{body}")
    return "\n\n".join(parts) + ("\n" if parts else "")


def headline(sections: Sections, limit: int = 120) -> str:
    """One line for a listing: the goal, else the first line of the status; empty when
    that reads as high sensitivity (a listing is an excerpt: it reaches session primers,
    and so a model's context, and the dashboard), judged on what it shows and 1,024
    characters past it, as thread excerpts are."""
    text = sections.goal or (sections.status.splitlines()[0] if sections.status else "")
    if window_reads_as_high(text, limit):
        return ""
    return clip(one_line(text), limit)


def sections_patch(agent: Mapping[str, Any]) -> Patch:
    """The agent's own sections as a patch: text and state lists replace, accumulating lists append.

    Keys with the value None are not part of the patch (the section is left as it was).
    """
    state: dict[str, Any] = {}
    added: dict[str, list[str]] = {}
    for name, value in agent.items():
        if value is None:
            continue
        if name in TEXT_SECTIONS:
            state[name] = str(value)
        elif name in STATE_LISTS:
            state[name] = [str(v) for v in value]
        elif name in ACCUMULATING:
            added[name] = [str(v) for v in value]
    return Patch(state, added)


def same(a: Sections, b: Sections) -> bool:
    return a.to_dict() == b.to_dict()


def dedupe_key(item: str) -> str:
    return _norm(item)
