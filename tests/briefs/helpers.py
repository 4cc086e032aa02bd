"""Shared helpers of the brief tests."""

from __future__ import annotations

import json
from typing import Any

from loom.ops.briefs.events import Event


def ev(kind: str, text: str = "", **kw: Any) -> Event:
    return Event(kind, text, **kw)


def answer(**fields: Any) -> str:
    """A model answer that follows the contract."""
    return json.dumps(fields)


def notes(n: int, size: int = 100, tag: str = "n") -> list[Event]:
    """n note events whose rendered line plus newline is exactly `size` characters."""
    head = len("[note]: ") + 1
    return [Event("note", f"{tag}{i:04d}" + "x" * (size - head - len(tag) - 4)) for i in range(n)]
