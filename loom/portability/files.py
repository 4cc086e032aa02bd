"""Source files for `loom import`: opened as a stream of bytes whatever they are packed
in (gzip, zstd, a zip archive holding conversations.json), never read whole; their
fingerprint; and which format they hold, told from their first bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import ijson
import zstandard

from loom.models.portability import FORMAT_NAME

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZIP_MAGIC = b"PK\x03\x04"
HEAD_BYTES = 1 << 20  # what format detection reads
FINGERPRINT_BYTES = 1 << 20  # from each end of the file
ZIP_MEMBERS = ("conversations.json",)


class SourceError(ValueError):
    """The file cannot be read on (malformed, or not a format Loom imports); `pos` says
    where."""

    def __init__(self, message: str, pos: str = "") -> None:
        super().__init__(f"{pos}: {message}" if pos else message)
        self.pos = pos
        self.message = message


@dataclass
class Opened:
    stream: BinaryIO  # the decompressed bytes
    raw: BinaryIO  # the file itself (its position: how far the import has read)
    size: int  # the file's size in bytes
    member: str = ""  # the zip member read, if any


def fingerprint(path: Path) -> str:
    """The file's size and a digest of its first and last MiB: the same file (copied,
    renamed, moved) gives the same one, a file grown or changed another."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return f"{size}-{h.hexdigest()[:32]}"


@contextmanager
def open_source(path: Path) -> Iterator[Opened]:
    raw = path.open("rb")
    try:
        magic = raw.read(4)
        raw.seek(0)
        size = path.stat().st_size
        if magic.startswith(ZIP_MAGIC):
            with zipfile.ZipFile(raw) as archive:
                member = _member(archive)
                with archive.open(member) as stream:
                    yield Opened(cast(BinaryIO, stream), raw, size, member)
            return
        if magic.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield Opened(cast(BinaryIO, stream), raw, size)
            return
        if magic.startswith(ZSTD_MAGIC):
            with zstandard.ZstdDecompressor().stream_reader(raw) as zs:
                yield Opened(cast(BinaryIO, io.BufferedReader(zs)), raw, size)
            return
        yield Opened(raw, raw, size)
    finally:
        raw.close()


def _member(archive: zipfile.ZipFile) -> str:
    names = archive.namelist()
    for wanted in ZIP_MEMBERS:
        found = [n for n in names if n.rsplit("/", 1)[-1] == wanted]
        if found:
            return found[0]
    raise SourceError(f"the archive holds no {' or '.join(ZIP_MEMBERS)}")


def peek(stream: BinaryIO) -> bytes:
    """The stream's first bytes, left unread (the stream is wrapped if it cannot peek)."""
    peeker = getattr(stream, "peek", None)
    if callable(peeker):
        got = peeker(HEAD_BYTES)
        if len(got) >= min(HEAD_BYTES, 64) or got:
            return bytes(got[:HEAD_BYTES])
    raise SourceError("the file cannot be read from its start")


def buffered(stream: BinaryIO) -> BinaryIO:
    if callable(getattr(stream, "peek", None)):
        return stream
    return cast(BinaryIO, io.BufferedReader(cast(io.RawIOBase, stream), HEAD_BYTES))


def detect(head: bytes, path: Path) -> str:
    """The format a file holds, from its first bytes (and its name for transcripts)."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"["):
        keys = _first_item_keys(text)
        if "mapping" in keys:
            return "chatgpt"
        if "chat_messages" in keys:
            return "claude"
        if "messages" in keys:
            return "openai"
        return "json"
    if text.startswith(b"{"):
        first = text.split(b"\n", 1)[0]
        try:
            obj = json.loads(first)
        except ValueError:
            raise SourceError("not JSON Lines: the first line is not one JSON object", "line 1") from None
        if not isinstance(obj, dict):
            return "jsonl"
        if obj.get("kind") == "header":
            if obj.get("format") != FORMAT_NAME:
                raise SourceError(f"a header of format {obj.get('format')!r}, not {FORMAT_NAME}", "line 1")
            return "loom"
        if obj.get("type") == "session_meta":
            return "codex"
        body = obj.get("body")
        if "messages" in obj or (isinstance(body, dict) and "messages" in body):
            return "openai"
        return "jsonl"
    if path.suffix.lower() in (".json", ".jsonl", ".ndjson"):
        raise SourceError("neither a JSON array nor JSON Lines", "byte 0")
    return "markdown"


def _first_item_keys(text: bytes) -> set[str]:
    keys: set[str] = set()
    try:
        for prefix, event, value in ijson.parse(io.BytesIO(text)):
            if prefix == "item" and event == "map_key":
                keys.add(str(value))
            elif prefix == "item" and event == "end_map":
                break
    except ijson.JSONError:
        pass  # the head ends mid-file: the keys seen so far decide
    return keys
