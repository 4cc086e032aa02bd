"""Transcript files, read into turns for `loom ingest-transcript` (and any client).

Three shapes:
- Markdown: sections headed by a line `# user` or `# assistant` (also `# system`,
  `# tool`; any case), each section's text is one turn. Other headings are part of the
  turn's text, and so is anything inside a fenced code block (``` or ~~~), so an
  answer that quotes a heading does not split. Text before the first heading, or a
  heading with nothing under it, is an error naming its line.
- JSON: an array of objects with `role` and `content` (and optionally `msg_id`).
- JSONL: one such object per line (blank lines skipped).
- Codex: a Codex CLI session file (`rollout-*.jsonl`: a `session_meta` line, then
  `response_item` lines); its user and assistant messages are the turns, less the
  context Codex itself injects as user messages (environment, instructions).

Every turn gets a stable msg_id: its own `msg_id` when the file gives one, else one
made from its position and a hash of its role and text, so ingesting the same file
again (or the same transcript grown longer) adds nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

ROLES = ("user", "assistant", "system", "tool")
Format = Literal["markdown", "json", "jsonl", "codex"]
FORMATS: tuple[Format, ...] = ("markdown", "json", "jsonl", "codex")


def is_format(fmt: str) -> TypeGuard[Format]:
    return fmt in FORMATS


# User messages Codex writes itself (not the person's words).
_CODEX_INJECTED = ("<environment_context>", "<user_instructions>", "# AGENTS.md")
_HEADING = re.compile(r"^#\s+(user|assistant|system|tool)\s*$", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(```|~~~)")
_SUFFIXES: dict[str, Format] = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


class TranscriptError(ValueError):
    """The file does not hold a transcript; `line` (1-based) names where, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@dataclass(frozen=True)
class TranscriptTurn:
    role: str
    content: str
    msg_id: str
    line: int  # where the turn starts in the file


def detect_format(path: Path, text: str) -> Format:
    """A Codex session file by its first line; else by the file's suffix, else by its
    first character (`[` JSON, `{` JSONL)."""
    if _is_codex(text):
        return "codex"
    by_suffix = _SUFFIXES.get(path.suffix.lower())
    if by_suffix is not None:
        return by_suffix
    head = text.lstrip()[:1]
    return "json" if head == "[" else "jsonl" if head == "{" else "markdown"


def parse(text: str, fmt: Format) -> list[TranscriptTurn]:
    turns = {"markdown": _markdown, "json": _json_array, "jsonl": _jsonl, "codex": _codex}[fmt](text)
    if not turns:
        raise TranscriptError("no turns found")
    seen: dict[str, int] = {}
    for t in turns:
        if t.msg_id in seen:
            raise TranscriptError(f"msg_id {t.msg_id!r} repeats the turn of line {seen[t.msg_id]}", t.line)
        seen[t.msg_id] = t.line
    return turns


def derived_thread_id(path: Path) -> str:
    """The thread a file's turns go to when no --thread-id is given: its name and a hash
    of where it is, the same on every run."""
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem)[:64] or "transcript"
    return f"ingest-{stem}-{where}"


def _msg_id(index: int, role: str, content: str) -> str:
    digest = hashlib.sha256(f"{role}\0{content}".encode()).hexdigest()[:16]
    return f"t{index:05d}-{digest}"


# -- Markdown ---------------------------------------------------------------------------


def _markdown(text: str) -> list[TranscriptTurn]:
    sections: list[tuple[str, int, list[str]]] = []  # role, heading line, body lines
    fenced = False
    for n, line in enumerate(text.splitlines(), start=1):
        heading = None if fenced else _HEADING.match(line)
        if _FENCE.match(line):
            fenced = not fenced
        if heading:
            sections.append((heading.group(1).lower(), n, []))
        elif sections:
            sections[-1][2].append(line)
        elif line.strip():
            raise TranscriptError("text before the first '# user' or '# assistant' heading", n)
    turns = []
    for i, (role, n, body) in enumerate(sections):
        content = "\n".join(body).strip()
        if not content:
            raise TranscriptError(f"the '# {role}' section is empty", n)
        turns.append(TranscriptTurn(role=role, content=content, msg_id=_msg_id(i, role, content), line=n))
    return turns


# -- JSON and JSONL -----------------------------------------------------------------------


def _json_array(text: str) -> list[TranscriptTurn]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"not JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(items, list):
        raise TranscriptError("a JSON transcript is an array of {role, content} objects", 1)
    lines = _item_lines(text, len(items))
    return [_turn(item, i, lines[i], f"item {i}") for i, item in enumerate(items)]


def _json_lines(text: str) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's number and value (JSONL, Codex session files)."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise TranscriptError(f"not JSON: {exc.msg}", n) from None


def _jsonl(text: str) -> list[TranscriptTurn]:
    turns: list[TranscriptTurn] = []
    for n, item in _json_lines(text):
        turns.append(_turn(item, len(turns), n, "the object"))
    return turns


def _turn(item: Any, index: int, line: int, what: str) -> TranscriptTurn:
    if not isinstance(item, dict):
        raise TranscriptError(f"{what} is not an object with role and content", line)
    role, content, msg_id = item.get("role"), item.get("content"), item.get("msg_id")
    if role not in ROLES:
        raise TranscriptError(f"{what}: role must be one of {', '.join(ROLES)}", line)
    if not isinstance(content, str) or not content.strip():
        raise TranscriptError(f"{what}: content must be non-empty text", line)
    if msg_id is not None and (not isinstance(msg_id, str) or not msg_id):
        raise TranscriptError(f"{what}: msg_id must be non-empty text", line)
    return TranscriptTurn(
        role=role, content=content, msg_id=msg_id or _msg_id(index, role, content), line=line
    )


def _item_lines(text: str, count: int) -> list[int]:
    """The line each top-level array item starts on (for errors), by a scan that
    follows strings and nesting."""
    lines: list[int] = []
    depth, line, in_str, escaped, in_item = 0, 1, False, False, False
    for ch in text:
        if ch == "\n":
            line += 1
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
            continue
        if depth == 1 and not in_item and not ch.isspace() and ch not in ",]":
            lines.append(line)  # the first character of the next item
            in_item = True
        if ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 1:
            in_item = False
    return (lines + [line] * count)[:count]


# -- Codex session files -------------------------------------------------------------------


def _is_codex(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(head, dict) and head.get("type") == "session_meta"


def _codex(text: str) -> list[TranscriptTurn]:
    turns: list[TranscriptTurn] = []
    for n, item in _json_lines(text):
        payload = item.get("payload") if isinstance(item, dict) else None
        if not isinstance(payload, dict) or item.get("type") != "response_item":
            continue
        role = payload.get("role")
        if payload.get("type") != "message" or role not in ("user", "assistant"):
            continue
        content = payload.get("content")
        parts = content if isinstance(content, list) else []
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        body = "\n".join(texts).strip()
        if body and not (role == "user" and body.startswith(_CODEX_INJECTED)):
            turns.append(
                TranscriptTurn(role=role, content=body, msg_id=_msg_id(len(turns), role, body), line=n)
            )
    return turns
