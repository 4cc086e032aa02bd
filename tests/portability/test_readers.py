"""The readers of `loom import`, on the shipped samples and small files made here (no
engine): format detection from content, packed files, ChatGPT's branches, and a Loom
export's header and checksum."""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from loom.portability import files, readers
from tests.portability.conftest import DATA


def _read(path: Path, fmt: str | None = None, **mapping: Any) -> tuple[str, list[readers.Unit]]:
    with files.open_source(path) as opened:
        stream = files.buffered(opened.stream)
        found = fmt or files.detect(files.peek(stream), path)
        return found, list(readers.read(found, stream, readers.Mapping(**mapping), path))


def test_each_sample_is_told_from_its_content_even_packed(tmp_path: Path) -> None:
    expected = {
        "chatgpt_conversations.json": "chatgpt",
        "claude_conversations.json": "claude",
        "openai_messages.jsonl": "openai",
        "transcript.md": "markdown",
    }
    for name, fmt in expected.items():
        assert _read(DATA / name)[0] == fmt, name
    archive = tmp_path / "chatgpt-export.zip"  # as ChatGPT sends it
    with zipfile.ZipFile(archive, "w") as z:
        z.write(DATA / "chatgpt_conversations.json", "export/conversations.json")
        z.writestr("export/chat.html", "<html></html>")
    packed = tmp_path / "claude.json.gz"
    packed.write_bytes(gzip.compress((DATA / "claude_conversations.json").read_bytes()))
    fmt, units = _read(archive)
    assert fmt == "chatgpt" and sum(len(u.records) for u in units) == 9  # 2 threads, 7 turns
    fmt, units = _read(packed)
    assert fmt == "claude" and [r["msg_id"] for r in units[0].records if r["kind"] == "turn"] == [
        "m-0001",
        "m-0002",
    ]


def test_a_chatgpt_tree_without_a_current_node_follows_its_latest_leaf(tmp_path: Path) -> None:
    convs = json.loads((DATA / "chatgpt_conversations.json").read_text())
    del convs[0]["current_node"]
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(convs[:1]))
    _, units = _read(path)
    assert [r["msg_id"] for r in units[0].records if r["kind"] == "turn"] == [
        "u-1",
        "a-1",
        "u-2",
        "t-1",
        "a-2",
    ]


def test_mapping_options_place_the_records() -> None:
    _, units = _read(DATA / "claude_conversations.json", agent="imp", user_id="u-9", thread_prefix="old/")
    turn = units[0].records[1]
    assert (turn["agent"], turn["user_id"], turn["thread_id"]) == (
        "imp",
        "u-9",
        "old/claude-c1a0c1a0-0000-4000-8000-000000000001",
    )
    _, units = _read(DATA / "openai_messages.jsonl", thread_id="one")
    assert {r["thread_id"] for u in units for r in u.records} == {"one"}


def _export(lines: list[dict[str, Any]], version: int = 1, checksum: str | None = None) -> bytes:
    body = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    head = {
        "kind": "header",
        "format": "loom-export",
        "format_version": version,
        "namespace": "n",
        "scope": {},
    }
    end = {"kind": "end", "rows": len(lines), "sha256": checksum or hashlib.sha256(body).hexdigest()}
    return json.dumps(head).encode() + b"\n" + body + json.dumps(end).encode() + b"\n"


TURN = {"kind": "turn", "thread_id": "t", "msg_id": "m", "role": "user", "content": "hi"}


def test_a_loom_export_is_checked_by_its_header_and_its_checksum(tmp_path: Path) -> None:
    good = tmp_path / "good.ndjson"
    good.write_bytes(_export([TURN, {**TURN, "msg_id": "m2"}]))
    fmt, units = _read(good)
    assert fmt == "loom" and [u.records[0]["pos"] for u in units] == ["line 2", "line 3"]
    cases = {
        "newer.ndjson": (_export([TURN], version=99), "line 1", "format version 99"),
        "corrupt.ndjson": (_export([TURN], checksum="0" * 64), "line 3", "checksum"),
        "cut.ndjson": (_export([TURN]).rsplit(b"\n", 2)[0] + b"\n", "end of file", "before its end line"),
    }
    for name, (raw, pos, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises(files.SourceError) as err:
            _read(path)
        assert err.value.pos == pos and words in err.value.message, name


def test_a_file_that_is_no_known_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text("just words")
    with pytest.raises(files.SourceError, match="neither a JSON array nor JSON Lines"):
        _read(path)
    other = tmp_path / "other.ndjson"
    other.write_text(json.dumps({"kind": "header", "format": "something-else"}) + "\n")
    with pytest.raises(files.SourceError, match="not loom-export"):
        _read(other)


def test_a_wrong_format_names_the_first_record_it_cannot_read() -> None:
    _, units = _read(DATA / "chatgpt_conversations.json", fmt="claude")
    assert units[0].records == [] and units[0].bad == [
        readers.Bad("conversation 0", "not a Claude conversation (no chat_messages)")
    ]
    _, units = _read(DATA / "claude_conversations.json", fmt="openai")
    assert units[0].bad[0].pos == "line 1" and units[0].bad[0].message.startswith("not JSON")
