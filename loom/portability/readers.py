"""The readers of `loom import`: each turns a source file into units (a conversation, a
line) of import records (the lines of Loom's own export format), streaming: the big
JSON arrays of the chat apps' exports are parsed one conversation at a time (ijson),
never loaded whole.

- ChatGPT's data export (`conversations.json`): each conversation's `mapping` is a tree
  of messages (edits and regenerations branch it); the turns are the branch the user
  last saw, from `current_node` up to the root, in order. A message's time is its
  `create_time`, its role `author.role`, its model `metadata.model_slug` (kept in the
  turn's metadata). Messages ChatGPT hides from the conversation and messages with no
  text (images, tool traces) are left out.
- Claude's data export (`conversations.json`): `chat_messages` in order, `sender`
  human / assistant, `created_at`; the text from `text`, else its content blocks of type
  text.
- OpenAI-style messages JSONL: one conversation per line, `{"messages": [{role,
  content}, ...]}` (or a batch request's `{"custom_id", "body": {"messages": ...}}`);
  content as text or as parts of type text.
- Loom's own export (docs/export-format.md): its body lines are the records, checked
  against the header's format version and the end line's checksum.
- The transcripts `loom ingest-transcript` reads (Markdown, a JSON array, JSONL, a
  Codex session file), through its own reader (loom.sdk.transcripts), as one unit.

Every id is derived from the source's own (a conversation's id makes its thread's, a
message's id its msg_id; sources without ids get ones derived from their content), so
importing a file again adds nothing. A record that cannot be taken (an unknown role, a
text over the limit) is reported with its position and the reader goes on; a file that
cannot be parsed on stops the reader (SourceError).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from loom.models.portability import FORMAT_VERSION
from loom.portability.files import SourceError
from loom.sdk import transcripts

ROLES = ("user", "assistant", "system", "tool")
MAX_CONTENT = 1_000_000  # characters of one turn (conversation.append's limit)
MAX_ID = 256


@dataclass
class Bad:
    """A record the reader could not take, and where it is."""

    pos: str
    message: str


@dataclass
class Unit:
    """One conversation (or line) of the source: its records, in order, and its bad ones."""

    index: int
    records: list[dict[str, Any]] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)


@dataclass(frozen=True)
class Mapping:
    """Where the records go (the import's options)."""

    agent: str | None = None
    user_id: str | None = None
    thread_prefix: str = ""
    thread_id: str | None = None

    def thread(self, derived: str) -> str:
        return self.thread_id or f"{self.thread_prefix}{derived}"[:MAX_ID]


def read(fmt: str, stream: BinaryIO, mapping: Mapping, path: Path) -> Iterator[Unit]:
    if fmt == "chatgpt":
        return _chatgpt(stream, mapping)
    if fmt == "claude":
        return _claude(stream, mapping)
    if fmt == "openai":
        return _openai(stream, mapping)
    if fmt == "loom":
        return _loom(stream, mapping)
    if transcripts.is_format(fmt):
        return _transcript(stream, fmt, mapping, path)
    raise SourceError(f"unknown format {fmt!r}")


# -- shared --------------------------------------------------------------------------------


def _iso(value: Any) -> str | None:
    """A source's time as RFC 3339 UTC: epoch seconds (ChatGPT) or an ISO string (Claude)."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC).isoformat()
    if isinstance(value, str):
        try:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    return None


def _digest(*parts: str, n: int = 16) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def _turn(
    mapping: Mapping,
    unit: Unit,
    *,
    pos: str,
    thread_id: str,
    msg_id: str,
    role: Any,
    content: str,
    ts: str | None,
    metadata: dict[str, Any],
) -> None:
    """Add a turn record to `unit`, or a Bad naming why it cannot be one."""
    if role not in ROLES:
        unit.bad.append(
            Bad(pos, f"unknown role {str(role)[:40]!r}: a turn's role is one of {', '.join(ROLES)}")
        )
        return
    if len(content) > MAX_CONTENT:
        unit.bad.append(
            Bad(pos, f"the text is {len(content):,} characters, over the limit of {MAX_CONTENT:,}")
        )
        return
    rec: dict[str, Any] = {
        "kind": "turn",
        "thread_id": thread_id,
        "msg_id": msg_id[:MAX_ID],
        "role": role,
        "content": content,
        "metadata": metadata,
        "pos": pos[:200],
    }
    if ts:
        rec["ts"] = ts
    if mapping.agent:
        rec["agent"] = mapping.agent
    if mapping.user_id:
        rec["user_id"] = mapping.user_id
    unit.records.append(rec)


def _thread(
    mapping: Mapping, unit: Unit, thread_id: str, title: str, metadata: dict[str, Any], **times: Any
) -> None:
    rec: dict[str, Any] = {
        "kind": "thread",
        "thread_id": thread_id,
        "title": title[:500],
        "metadata": metadata,
    }
    rec.update({k: v for k, v in times.items() if v})
    if mapping.agent:
        rec["agent"] = mapping.agent
    rec["pos"] = f"conversation {unit.index}"
    unit.records.append(rec)


@dataclass(frozen=True, kw_only=True)
class _Export:
    """Where a chat export keeps a conversation's header fields."""

    source: str  # the export's name: the threads' id prefix and their metadata's "source"
    title: str
    created: str
    updated: str


_CHATGPT = _Export(source="chatgpt", title="title", created="create_time", updated="update_time")
_CLAUDE = _Export(source="claude", title="name", created="created_at", updated="updated_at")


def _conversation_thread(
    mapping: Mapping, unit: Unit, export: _Export, conv: dict[str, Any], conv_id: str
) -> str:
    """The conversation's thread record, added to the unit; its thread id."""
    thread_id = mapping.thread(f"{export.source}-{conv_id}")
    _thread(
        mapping,
        unit,
        thread_id,
        str(conv.get(export.title) or ""),
        {"source": export.source, "conversation_id": conv_id},
        created_at=_iso(conv.get(export.created)),
        updated_at=_iso(conv.get(export.updated)),
    )
    return thread_id


def _whole_digest(conv: dict[str, Any]) -> str:
    """An id for a conversation whose export names none: its content's digest."""
    return _digest(json.dumps(conv, sort_keys=True)[:4096])


def _items(stream: BinaryIO, what: str) -> Iterator[tuple[int, Any]]:
    """The items of a top-level JSON array, one at a time; a syntax error stops the
    reader, naming the last item read whole."""
    i = -1
    try:
        for i, item in enumerate(ijson.items(stream, "item", use_float=True)):
            yield i, item
    except ijson.JSONError as exc:
        raise SourceError(
            f"malformed JSON ({str(exc)[:120]})", f"after {what} {i}" if i >= 0 else "at its start"
        ) from None


# -- ChatGPT -------------------------------------------------------------------------------


def _chatgpt(stream: BinaryIO, mapping: Mapping) -> Iterator[Unit]:
    for i, conv in _items(stream, "conversation"):
        unit = Unit(i)
        if not isinstance(conv, dict) or not isinstance(conv.get("mapping"), dict):
            unit.bad.append(Bad(f"conversation {i}", "not a ChatGPT conversation (no mapping)"))
            yield unit
            continue
        conv_id = str(conv.get("conversation_id") or conv.get("id") or _whole_digest(conv))
        thread_id = _conversation_thread(mapping, unit, _CHATGPT, conv, conv_id)
        for node_id, msg in _branch(conv["mapping"], conv.get("current_node")):
            pos = f"conversation {i} ({conv_id[:40]}) message {node_id[:60]}"
            text = _chatgpt_text(msg.get("content"))
            meta: dict[str, Any] = msg["metadata"] if isinstance(msg.get("metadata"), dict) else {}
            if not text.strip() or meta.get("is_visually_hidden_from_conversation"):
                continue
            author: dict[str, Any] = msg["author"] if isinstance(msg.get("author"), dict) else {}
            extra: dict[str, Any] = {"source": "chatgpt"}
            if meta.get("model_slug"):
                extra["model"] = str(meta["model_slug"])[:128]
            if author.get("name"):
                extra["author"] = str(author["name"])[:128]
            _turn(
                mapping,
                unit,
                pos=pos,
                thread_id=thread_id,
                msg_id=str(msg.get("id") or node_id),
                role=author.get("role"),
                content=text,
                ts=_iso(msg.get("create_time")) or _iso(conv.get("create_time")),
                metadata=extra,
            )
        yield unit


def _branch(tree: dict[str, Any], current: Any) -> list[tuple[str, dict[str, Any]]]:
    """The messages from the root down to `current_node` (the branch the user last saw);
    with no current node, the branch to the most recent leaf."""
    node_id = current if isinstance(current, str) and current in tree else _latest_leaf(tree)
    path: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    while isinstance(node_id, str) and node_id in tree and node_id not in seen:
        seen.add(node_id)
        node = tree[node_id] if isinstance(tree[node_id], dict) else {}
        msg = node.get("message")
        if isinstance(msg, dict):
            path.append((node_id, msg))
        node_id = node.get("parent")
    return path[::-1]


def _latest_leaf(tree: dict[str, Any]) -> str | None:
    leaves = [(k, v) for k, v in tree.items() if isinstance(v, dict) and not v.get("children")]

    def when(item: tuple[str, Any]) -> float:
        msg = item[1].get("message")
        t = msg.get("create_time") if isinstance(msg, dict) else None
        return float(t) if isinstance(t, int | float) else 0.0

    return max(leaves, key=when)[0] if leaves else None


def _chatgpt_text(content: Any) -> str:
    if not isinstance(content, dict):
        return ""
    parts = content.get("parts")
    if isinstance(parts, list):
        return "\n".join(p for p in parts if isinstance(p, str))
    for key in ("text", "result"):
        if isinstance(content.get(key), str):
            return str(content[key])
    return ""


# -- Claude --------------------------------------------------------------------------------

_SENDERS = {"human": "user", "assistant": "assistant"}


def _claude(stream: BinaryIO, mapping: Mapping) -> Iterator[Unit]:
    for i, conv in _items(stream, "conversation"):
        unit = Unit(i)
        messages = conv.get("chat_messages") if isinstance(conv, dict) else None
        if not isinstance(messages, list):
            unit.bad.append(Bad(f"conversation {i}", "not a Claude conversation (no chat_messages)"))
            yield unit
            continue
        conv_id = str(conv.get("uuid") or _whole_digest(conv))
        thread_id = _conversation_thread(mapping, unit, _CLAUDE, conv, conv_id)
        for j, msg in enumerate(messages):
            if not isinstance(msg, dict):
                unit.bad.append(Bad(f"conversation {i} ({conv_id[:40]}) message {j}", "not a message object"))
                continue
            mid = str(msg.get("uuid") or f"m{j:05d}-{_digest(json.dumps(msg, sort_keys=True))}")
            text = _claude_text(msg)
            if not text.strip():
                continue
            sender = msg.get("sender")
            _turn(
                mapping,
                unit,
                pos=f"conversation {i} ({conv_id[:40]}) message {j} ({mid[:40]})",
                thread_id=thread_id,
                msg_id=mid,
                role=_SENDERS.get(sender, sender) if isinstance(sender, str) else sender,
                content=text,
                ts=_iso(msg.get("created_at")),
                metadata={"source": "claude"},
            )
        yield unit


def _claude_text(msg: dict[str, Any]) -> str:
    if isinstance(msg.get("text"), str) and msg["text"].strip():
        return str(msg["text"])
    blocks = msg.get("content")
    if isinstance(blocks, list):
        return "\n".join(
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


# -- OpenAI-style messages JSONL ----------------------------------------------------------

_OPENAI_ROLES = {"developer": "system", "function": "tool"}


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    for n, raw in enumerate(stream, start=1):
        if raw.strip():
            yield n, raw


def _json_line(n: int, raw: bytes) -> tuple[Any, Bad | None]:
    try:
        return json.loads(raw), None
    except ValueError as exc:
        return None, Bad(f"line {n}", f"not JSON ({str(exc)[:80]})")


def _openai(stream: BinaryIO, mapping: Mapping) -> Iterator[Unit]:
    for index, (n, raw) in enumerate(_lines(stream)):
        unit = Unit(index)
        obj, bad = _json_line(n, raw)
        body = obj.get("body") if isinstance(obj, dict) and isinstance(obj.get("body"), dict) else obj
        messages = body.get("messages") if isinstance(body, dict) else None
        if bad is not None or not isinstance(messages, list):
            unit.bad.append(bad or Bad(f"line {n}", "not a conversation: no messages array"))
            yield unit
            continue
        cid = obj.get("custom_id") or obj.get("id") if isinstance(obj, dict) else None
        thread_id = mapping.thread(
            f"openai-{cid}"
            if isinstance(cid, str) and cid
            else f"openai-{_digest(raw.decode('utf-8', 'replace'))}"
        )
        for j, m in enumerate(messages):
            pos = f"line {n} message {j}"
            if not isinstance(m, dict):
                unit.bad.append(Bad(pos, "not a message object"))
                continue
            role = m.get("role")
            role = _OPENAI_ROLES.get(role, role) if isinstance(role, str) else role
            text = _openai_text(m.get("content"))
            if not text.strip() and not m.get("tool_calls"):
                continue
            if not text.strip():
                text = json.dumps(m["tool_calls"], ensure_ascii=False)
            mid = str(m["id"]) if isinstance(m.get("id"), str) else f"m{j:05d}-{_digest(str(role), text)}"
            extra: dict[str, Any] = {"source": "openai"}
            if isinstance(m.get("name"), str):
                extra["name"] = m["name"][:128]
            _turn(
                mapping,
                unit,
                pos=pos,
                thread_id=thread_id,
                msg_id=mid,
                role=role,
                content=text,
                ts=None,
                metadata=extra,
            )
        yield unit


def _openai_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict)
            and p.get("type") in ("text", "input_text", "output_text")
            and isinstance(p.get("text"), str)
        )
    return ""


# -- Loom's own export --------------------------------------------------------------------

_CONVERSATION_KINDS = ("thread", "turn", "redaction")


def _loom(stream: BinaryIO, mapping: Mapping) -> Iterator[Unit]:
    """The body lines as records; the header's format version is checked first, the end
    line's checksum (over the body lines' bytes) last."""
    digest = hashlib.sha256()
    lines = _lines(stream)
    first = next(lines, None)
    if first is None:
        raise SourceError("the file is empty", "line 1")
    header, bad = _json_line(*first)
    if bad is not None or not isinstance(header, dict) or header.get("kind") != "header":
        raise SourceError("a Loom export starts with its header line", "line 1")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SourceError(f"format version {version!r}: this Loom reads up to {FORMAT_VERSION}", "line 1")
    ended = False
    for index, (n, raw) in enumerate(lines):
        obj, bad = _json_line(n, raw)
        if isinstance(obj, dict) and obj.get("kind") == "end":
            if obj.get("sha256") != digest.hexdigest() or obj.get("rows") != index:
                raise SourceError(
                    "the checksum or row count of the end line does not match the lines read", f"line {n}"
                )
            ended = True
            break
        digest.update(raw if raw.endswith(b"\n") else raw + b"\n")
        unit = Unit(index)
        if bad is not None or not isinstance(obj, dict):
            unit.bad.append(bad or Bad(f"line {n}", "not a JSON object"))
        else:
            obj["pos"] = f"line {n}"
            if obj.get("kind") in _CONVERSATION_KINDS:
                if mapping.agent:
                    obj["agent"] = mapping.agent
                if mapping.thread_prefix and isinstance(obj.get("thread_id"), str):
                    obj["thread_id"] = f"{mapping.thread_prefix}{obj['thread_id']}"[:MAX_ID]
            unit.records.append(obj)
        yield unit
    if not ended:
        raise SourceError("the export ends before its end line (cut short?)", "end of file")


# -- ingest-transcript's transcripts ------------------------------------------------------


def _transcript(stream: BinaryIO, fmt: transcripts.Format, mapping: Mapping, path: Path) -> Iterator[Unit]:
    """One transcript, one unit (such files are one session: read whole, as
    ingest-transcript reads them)."""
    try:
        text = stream.read().decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError("not UTF-8 text") from None
    try:
        turns = transcripts.parse(text, fmt)
    except transcripts.TranscriptError as exc:
        raise SourceError(str(exc)) from None
    thread_id = mapping.thread_id or f"{mapping.thread_prefix}{transcripts.derived_thread_id(path)}"[:MAX_ID]
    unit = Unit(0)
    for t in turns:
        _turn(
            mapping,
            unit,
            pos=f"line {t.line}",
            thread_id=thread_id,
            msg_id=t.msg_id,
            role=t.role,
            content=t.content,
            ts=None,
            metadata={},
        )
    yield unit
