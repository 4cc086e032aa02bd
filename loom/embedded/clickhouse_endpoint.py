"""The embedded ClickHouse endpoint: chdb behind ClickHouse's HTTP interface.

No ClickHouse server can be installed where Loom runs embedded, and chdb (ClickHouse
in-process) cannot open ClickHouse's HTTP listener. chdb also allows one process per
data path. So one process, this one, owns the chdb engine and speaks the subset of
ClickHouse's HTTP interface that clickhouse-connect uses; the API and every worker
connect to it exactly as they would to a real server.

It is a protocol adapter and nothing more: no Loom logic lives here.

Run it:  python -m loom.embedded.clickhouse_endpoint --data-dir DIR --port PORT
Use it:  start_endpoint(DIR) / find_running_endpoint(DIR)

What is served (mirroring the real server where clickhouse-connect can tell):
  GET /ping, GET /                  -> "Ok.\\n"
  POST|GET /?query=...              -> the SQL is the `query` parameter, then "\\n", then
                                       the body (an INSERT ... FORMAT keeps its data there)
  settings as URL parameters        -> SET on the chdb handle, for that request only
  param_NAME                        -> server-side query parameters {NAME:Type}
  session_id (+ session_timeout, session_check) -> a chdb connection handle of its own
  multipart/form-data bodies        -> `query` and param_* fields (large bound parameters)
  Content-Encoding / Accept-Encoding (with enable_http_compression=1): lz4, zstd, gzip,
  deflate; decompress=1 (ClickHouse block-compressed body)
  errors                            -> 4xx/5xx (never 429/503/504, which the client
                                       retries), body "Code: N. DB::Exception: ...",
                                       header X-ClickHouse-Exception-Code
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import email.policy
import fcntl
import ipaddress
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, cast
from urllib.parse import parse_qsl, urlsplit

from loom.embedded.engine_housekeeping import (
    MEMORY_RELEASE_S,
    VECTOR_CACHE_CHECK_S,
    VectorCacheTrim,
    release_free_memory,
)

PORT_FILE = "endpoint.port"
LOCK_FILE = "endpoint.lock"
LOG_FILE = "endpoint.log"
LISTENING_PREFIX = "LISTENING "

EXIT_OK = 0
EXIT_BAD_ARGS = 2
EXIT_ALREADY_RUNNING = 3
EXIT_ENGINE_FAILED = 4
EXIT_DRAIN_TIMEOUT = 5

SERVER_DISPLAY_NAME = "loom-embedded-clickhouse"
DEFAULT_SESSION_TIMEOUT_S = 60.0  # ClickHouse's default_session_timeout
MAX_SESSION_TIMEOUT_S = 3600.0  # ClickHouse's max_session_timeout
DRAIN_TIMEOUT_S = 30.0  # how long SIGTERM waits for in-flight requests

_READ_CHUNK = 1 << 20
_INSERT_APPEND_MIN = 1 << 20  # coalesce body chunks: fewer, larger appends into chdb
_INSERT_HEAD_PEEK = 64 << 10  # an INSERT header must show up within this many body bytes
_SINGLE_WRITE_MAX = 4 << 20  # above this, head and body go in two writes (no big copy)
_MAX_IDLE_HANDLES = 32
DEFAULT_CACHE_MB = 2048  # the engine's caches together (engine_cache_settings)


# --------------------------------------------------------------------------------------
# Public API used by the rest of Loom
# --------------------------------------------------------------------------------------


class EndpointError(RuntimeError):
    """The endpoint could not be started."""


class EndpointAlreadyRunning(EndpointError):
    """Another endpoint process owns the data directory (use find_running_endpoint)."""


@dataclass
class EndpointProcess:
    """A running endpoint subprocess started by start_endpoint()."""

    process: subprocess.Popen[bytes]
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def alive(self) -> bool:
        return self.process.poll() is None

    def __enter__(self) -> EndpointProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the endpoint drains in-flight requests and closes chdb cleanly),
        then SIGKILL if it has not exited within `timeout` seconds."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()


def start_endpoint(
    data_dir: Path,
    port: int = 0,
    *,
    timeout: float = 30.0,
    die_with_parent: bool = False,
    cache_mb: int = DEFAULT_CACHE_MB,
) -> EndpointProcess:
    """Spawn the endpoint on `data_dir` and return once it accepts connections.

    Raises EndpointAlreadyRunning if another endpoint owns the directory, EndpointError
    if it fails to start in `timeout` seconds. Its stderr goes to DIR/endpoint.log.
    With die_with_parent (Linux), the kernel stops it when the calling thread exits.
    The engine's caches together stay under `cache_mb` MiB (engine_cache_settings).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / LOG_FILE
    with open(log_path, "ab") as log:
        log_offset = log.tell()
        proc = _popen(data_dir, port, subprocess.PIPE, log, die_with_parent, cache_mb)
    assert proc.stdout is not None
    try:
        line = _read_listening_line(proc, proc.stdout, timeout)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finally:
        proc.stdout.close()
    if line is None:
        detail = _log_tail(log_path, log_offset)
        if proc.returncode == EXIT_ALREADY_RUNNING:
            raise EndpointAlreadyRunning(detail or f"another endpoint owns {data_dir}")
        raise EndpointError(
            f"ClickHouse endpoint on {data_dir} did not start "
            f"(exit code {proc.returncode}): {detail or 'no output'}"
        )
    host, _, port_text = line[len(LISTENING_PREFIX) :].rpartition(":")
    return EndpointProcess(proc, int(port_text), host.strip("[]"))


def spawn_endpoint(
    data_dir: Path, port: int, *, die_with_parent: bool = False, cache_mb: int = DEFAULT_CACHE_MB
) -> subprocess.Popen[bytes]:
    """Start the endpoint on a known port without waiting for it (a supervisor's
    restart keeps the URL every client has). All its output goes to DIR/endpoint.log;
    ping(url) says when it is up."""
    data_dir = Path(data_dir).resolve()
    with open(data_dir / LOG_FILE, "ab") as log:
        return _popen(data_dir, port, log, log, die_with_parent, cache_mb)


def _popen(
    data_dir: Path, port: int, stdout: Any, stderr: Any, die_with_parent: bool, cache_mb: int
) -> subprocess.Popen[bytes]:
    from loom.embedded.lifeline import die_with_parent as lifeline

    cmd = [
        sys.executable,
        "-m",
        "loom.embedded.clickhouse_endpoint",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--cache-mb",
        str(cache_mb),
    ]
    # The child must import this package even if it is not installed (run from a checkout).
    package_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TZ": "UTC", "PYTHONPATH": pythonpath}
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=env,
        close_fds=True,
        preexec_fn=lifeline() if die_with_parent else None,
    )


def endpoint_pid(data_dir: Path) -> int | None:
    """The pid of the endpoint process that owns `data_dir`, if one runs (answering or
    not): the lock file names it, its command line must confirm it."""
    import psutil

    data_dir = Path(data_dir).resolve()
    try:
        pid = int((data_dir / LOCK_FILE).read_text().strip())
        cmdline = psutil.Process(pid).cmdline()
    except (OSError, ValueError, psutil.Error):
        return None
    ours = "loom.embedded.clickhouse_endpoint" in cmdline and str(data_dir) in cmdline
    return pid if ours else None


def find_running_endpoint(data_dir: Path) -> str | None:
    """The URL of the endpoint serving `data_dir`, if one is running and answers /ping."""
    port = read_port_file(Path(data_dir))
    if port is None:
        return None
    url = f"http://127.0.0.1:{port}"
    # The file outlives a SIGKILL: make sure whatever answers is an endpoint of ours.
    return url if ping(url, require_endpoint=True) else None


def read_port_file(data_dir: Path) -> int | None:
    try:
        return int((Path(data_dir) / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def ping(url: str, timeout: float = 2.0, *, require_endpoint: bool = False) -> bool:
    """GET /ping answers "Ok."; with require_endpoint, from this endpoint (not
    some other server that took the port)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/ping", timeout=timeout) as resp:
            ours = resp.headers.get("X-ClickHouse-Server-Display-Name") == SERVER_DISPLAY_NAME
            return bool(
                resp.status == 200 and resp.read().startswith(b"Ok.") and (ours or not require_endpoint)
            )
    except (OSError, ValueError):
        return False


def _read_listening_line(proc: subprocess.Popen[bytes], out: IO[bytes], timeout: float) -> str | None:
    """Wait for the child's LISTENING line; None if it exits first. Other stdout
    lines (an engine banner, say) are skipped."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = out.fileno()
    while True:
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.decode(errors="replace").strip()
            if line.startswith(LISTENING_PREFIX):
                return line
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EndpointError(f"ClickHouse endpoint did not report LISTENING within {timeout:.0f}s")
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if ready:
            data = os.read(fd, 4096)
            if not data:  # stdout closed: the child exited (or is exiting)
                proc.wait(max(0.0, deadline - time.monotonic()))
                return None
            buf += data


def _log_tail(path: Path, offset: int, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()[-limit:].decode(errors="replace").strip()
    except OSError:
        return ""


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# --------------------------------------------------------------------------------------
# ClickHouse errors
# --------------------------------------------------------------------------------------

# Error codes this adapter raises itself (names as in ClickHouse's ErrorCodes.cpp).
_NOT_IMPLEMENTED = (48, "NOT_IMPLEMENTED")
_SYNTAX_ERROR = (62, "SYNTAX_ERROR")
_CANNOT_DECOMPRESS = (271, "CANNOT_DECOMPRESS")
_SESSION_NOT_FOUND = (372, "SESSION_NOT_FOUND")
_SESSION_IS_LOCKED = (373, "SESSION_IS_LOCKED")
_INVALID_SESSION_TIMEOUT = (374, "INVALID_SESSION_TIMEOUT")
_UNKNOWN_EXCEPTION = (1002, "UNKNOWN_EXCEPTION")

# HTTP status per exception code, as the real server maps them (HTTPHandler.cpp). Any
# other code is a 500. None of them is 429/503/504: clickhouse-connect retries those.
_HTTP_400_CODES = frozenset({6, 8, 15, 26, 27, 38, 41, 44, 53, 62, 69, 70, 72, 117, 167, 168, 321})
_HTTP_404_CODES = frozenset({46, 47, 50, 56, 60, 73, 81, 85, 115, 170, 281, 511})
_HTTP_STATUS_BY_CODE = {48: 501, 202: 413, 372: 404, 373: 409, 374: 400}

_CODE_RE = re.compile(r"Code: (\d+)\.")


class ClickHouseError(Exception):
    """An error to report in ClickHouse's own shape."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code
        self.text = text

    @classmethod
    def of(cls, code_name: tuple[int, str], message: str) -> ClickHouseError:
        code, name = code_name
        return cls(code, f"Code: {code}. DB::Exception: {message}. ({name})")

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """chdb raises RuntimeError/ChdbError whose text holds ClickHouse's
        "Code: N. DB::Exception: ..." (sometimes after a chdb prefix)."""
        text = str(exc)
        match = _CODE_RE.search(text)
        if match is None:
            return cls.of(_UNKNOWN_EXCEPTION, f"{type(exc).__name__}: {text}")
        return cls(int(match.group(1)), text[match.start() :].strip())

    @property
    def http_status(self) -> int:
        if self.code in _HTTP_400_CODES:
            return 400
        if self.code in _HTTP_404_CODES:
            return 404
        return _HTTP_STATUS_BY_CODE.get(self.code, 500)


# --------------------------------------------------------------------------------------
# SQL shape: the few facts the adapter needs about a statement
# --------------------------------------------------------------------------------------

_LEADING_NOISE_RE = re.compile(rb"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.S)
_FIRST_WORDS_RE = re.compile(rb"([A-Za-z_]+|\()\s*([A-Za-z_]*)")
_TRAILING_FORMAT_RE = re.compile(rb"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*\Z", re.I)
# "INSERT INTO <target> FORMAT <fmt>" whose data follows the format name.
_INSERT_WITH_FORMAT_RE = re.compile(
    rb"\A(?P<head>\s*INSERT\s+INTO\s+.*?)\bFORMAT\s+(?P<fmt>[A-Za-z][A-Za-z0-9_]*)", re.I | re.S
)
_QUOTED_RE = re.compile(rb"`[^`]*`|\"[^\"]*\"|'(?:[^'\\]|\\.)*'", re.S)
_INLINE_SOURCE_RE = re.compile(rb"\b(?:SELECT|VALUES|WITH)\b", re.I)

# Statements that return a result set (the server then sends X-ClickHouse-Format,
# which is how clickhouse-connect's command() tells "" from a QuerySummary).
_RESULT_KEYWORDS = frozenset(
    {"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS", "EXPLAIN", "CHECK", "("}
)


@dataclass(frozen=True)
class _StatementKind:
    first: str  # first keyword, upper-cased ("(" for a parenthesised select)
    second: str

    @property
    def returns_rows(self) -> bool:
        return self.first in _RESULT_KEYWORDS

    @property
    def is_set(self) -> bool:
        return self.first == "SET"

    @property
    def is_use(self) -> bool:
        return self.first == "USE"

    @property
    def changes_session_state(self) -> bool:
        """Leaves state on the chdb handle that must not reach another client's request."""
        return self.first in ("SET", "USE") or (self.first == "CREATE" and self.second == "TEMPORARY")


def _statement_kind(sql: bytes) -> _StatementKind:
    noise = _LEADING_NOISE_RE.match(sql)
    match = _FIRST_WORDS_RE.match(sql, noise.end() if noise else 0)
    if match is None:
        return _StatementKind("", "")
    return _StatementKind(match.group(1).decode().upper(), match.group(2).decode().upper())


def _output_format(sql: bytes, default: str) -> str:
    match = _TRAILING_FORMAT_RE.search(sql)
    return match.group(1).decode() if match else default


@dataclass(frozen=True)
class _InsertHead:
    """An INSERT whose data follows in the request: the statement for chdb's
    send_insert (no FORMAT clause), the input format, and where the data starts."""

    statement: str
    fmt: str
    data_start: int


def _parse_insert_head(text: bytes) -> _InsertHead | None:
    match = _INSERT_WITH_FORMAT_RE.match(text)
    if match is None:
        return None
    # "INSERT INTO t SELECT ... FORMAT x" or "... VALUES" has its source inline: not ours.
    if _INLINE_SOURCE_RE.search(_QUOTED_RE.sub(b"", match.group("head"))):
        return None
    # Like ClickHouse: after the format name skip blanks, then one optional CR LF.
    pos = match.end()
    while pos < len(text) and text[pos] in b" \t\f":
        pos += 1
    if text.startswith(b"\r", pos):
        pos += 1
    if text.startswith(b"\n", pos):
        pos += 1
    return _InsertHead(match.group("head").decode().strip(), match.group("fmt").decode(), pos)


# --------------------------------------------------------------------------------------
# Request bodies: transfer framing and compression
# --------------------------------------------------------------------------------------


class _BadRequest(Exception):
    """Malformed HTTP framing: answer 400 and close the connection."""


def _raw_body(rfile: BinaryIO, headers: Any) -> Iterator[bytes]:
    """The request body as it arrives (Content-Length or chunked). clickhouse-connect
    streams inserts with chunked transfer encoding, which http.server does not decode."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        while True:
            size_line = rfile.readline(65537)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            yield _read_exact(rfile, size)
            rfile.readline(65537)  # CRLF after the chunk
    remaining = int(headers.get("Content-Length") or 0)
    while remaining > 0:
        data = rfile.read(min(remaining, _READ_CHUNK))
        if not data:
            raise _BadRequest("request body shorter than Content-Length")
        remaining -= len(data)
        yield data


def _read_exact(rfile: BinaryIO, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise _BadRequest("connection closed inside a chunk")
    return data


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


def _new_decompressor(encoding: str) -> _Decompressor:
    if encoding == "lz4":
        import lz4.frame

        decompressor: _Decompressor = lz4.frame.LZ4FrameDecompressor()
        return decompressor
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()
    if encoding == "gzip":
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise ClickHouseError.of(_NOT_IMPLEMENTED, f"Unsupported Content-Encoding '{encoding}'")


def _decode_body(chunks: Iterable[bytes], encoding: str) -> Iterator[bytes]:
    """Decompress a body that may hold several concatenated frames/members.

    Every frame must be read: clickhouse-connect sends one lz4 (or zstd) frame per
    Native block, and lz4.frame.decompress() silently stops after the first one.
    """
    decoder = _new_decompressor(encoding)
    pending = False  # inside a frame that has not ended yet
    try:
        for chunk in chunks:
            while chunk:
                out = decoder.decompress(chunk)
                pending = not decoder.eof
                if out:
                    yield out
                if not decoder.eof:
                    break
                chunk = decoder.unused_data  # the next frame starts here
                decoder = _new_decompressor(encoding)
    except ClickHouseError:
        raise
    except Exception as exc:
        raise ClickHouseError.of(
            _CANNOT_DECOMPRESS, f"Cannot decompress {encoding} request body: {exc}"
        ) from exc
    if pending:
        raise ClickHouseError.of(_CANNOT_DECOMPRESS, f"Truncated {encoding} request body")


def _decode_native_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """decompress=1: the body is in ClickHouse's block compression format, each block
    16 bytes of CityHash128 checksum, 1 byte method, UInt32 compressed size (including
    the 9 byte header) and UInt32 decompressed size. The checksum is not verified
    (no CityHash128 here); loopback traffic does not get corrupted in flight."""
    import lz4.block
    import zstandard

    buf = bytearray()
    for chunk in itertools.chain(chunks, [b""]):
        buf += chunk
        while len(buf) >= 25:
            method = buf[16]
            size = int.from_bytes(buf[17:21], "little")
            raw_size = int.from_bytes(buf[21:25], "little")
            if len(buf) < 16 + size:
                break
            payload = bytes(buf[25 : 16 + size])
            del buf[: 16 + size]
            if method == 0x02:
                yield payload
            elif method == 0x82:
                yield lz4.block.decompress(payload, uncompressed_size=raw_size)
            elif method == 0x90:
                yield zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_size)
            else:
                raise ClickHouseError.of(_CANNOT_DECOMPRESS, f"Unknown compression method 0x{method:02x}")
    if buf:
        raise ClickHouseError.of(_CANNOT_DECOMPRESS, "Truncated compressed block in request body")


def _coalesce(chunks: Iterable[bytes], min_size: int) -> Iterator[bytes]:
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        if len(buf) >= min_size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _compress_response(body: bytes | memoryview, encoding: str) -> bytes:
    if encoding == "lz4":
        import lz4.frame

        compressed: bytes = lz4.frame.compress(body)
        return compressed
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=1).compress(body)
    if encoding == "gzip":
        gz = zlib.compressobj(3, wbits=16 + zlib.MAX_WBITS)
        return gz.compress(body) + gz.flush()
    return zlib.compress(body, 3)  # deflate (zlib wrapper, as HTTP means it)


_RESPONSE_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")


def _pick_response_encoding(accept_encoding: str) -> str | None:
    """The client's first listed encoding that we can produce."""
    for item in accept_encoding.split(","):
        name = item.split(";", 1)[0].strip().lower()
        if name in _RESPONSE_ENCODINGS:
            return name
    return None


def _parse_multipart(body: bytes, content_type: str) -> list[tuple[str, str | None, bytes]]:
    """(name, filename, value) per part. clickhouse-connect switches to a form when
    bound parameters are too large for the URL (e.g. an embedding vector)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    parts: list[tuple[str, str | None, bytes]] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        value = payload if isinstance(payload, bytes) else b""
        parts.append((str(name or ""), part.get_filename(), value))
    return parts


# --------------------------------------------------------------------------------------
# The chdb engine: connection handles, sessions, per-request settings
# --------------------------------------------------------------------------------------

# URL parameters that belong to the HTTP transport, never SET on the engine (chdb
# would reject several of them as unknown settings).
_TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "role",
        "session_id",
        "session_timeout",
        "session_check",
        "query_id",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "enable_http_compression",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "http_wait_end_of_query",
        "http_response_buffer_size",
        "cancel_http_readonly_queries_on_client_close",
        "add_http_cors_header",
        "stacktrace",
        "http_native_compression_disable_checksumming_on_decompress",
    }
)
_SETTING_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def _sql_literal(value: str) -> str:
    # Quoted always: ClickHouse converts a string literal to the setting's type.
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _setting_name(name: str) -> str:
    if not _SETTING_NAME_RE.match(name):
        raise ClickHouseError.of((115, "UNKNOWN_SETTING"), f"Invalid setting name '{name}'")
    return name


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class _Handle:
    """One chdb connection (its own SET/USE/temporary-table state) and what the
    adapter has applied to it, so a request's URL settings cost nothing when they
    match the previous request's and never outlive the request otherwise."""

    def __init__(self, conn: Any, database: str):
        self.conn = conn
        self.default_database = database
        self.database = database  # the handle's current database (per USE)
        self.discard = False  # sessionless handle left with state: close, never reuse
        self.applied: dict[str, str] = {}  # URL settings currently SET on it
        # Session handles only: once the client has run SET, the session's own value
        # of each setting a URL parameter overrides, to put back afterwards (SQL
        # literal; a setting not in here goes back to DEFAULT).
        self.user_set = False
        self.baseline: dict[str, str] = {}

    def run(self, sql: bytes | str, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Any:
        try:
            result = self.conn.query(sql, fmt, params=params or {})
        except Exception as exc:  # chdb raises RuntimeError / ChdbError
            raise ClickHouseError.from_engine(exc) from None
        if result is not None and result.has_error():
            raise ClickHouseError.from_engine(RuntimeError(result.error_message()))
        return result

    def use_database(self, database: str) -> None:
        if database != self.database:
            self.run(f"USE {_quote_identifier(database)}")
            self.database = database

    def apply_settings(self, wanted: dict[str, str]) -> None:
        for name in [n for n in self.applied if n not in wanted]:
            self._restore(name)
        for name, value in wanted.items():
            if self.applied.get(name) == value:
                continue
            if name not in self.applied and self.user_set:
                self._capture_baseline(name)
            self.run(f"SET {_setting_name(name)} = {_sql_literal(value)}")
            self.applied[name] = value

    def reset_settings(self) -> None:
        for name in list(self.applied):
            self._restore(name)

    def note_user_set(self) -> None:
        """The client ran SET in its session: earlier baselines are stale."""
        self.user_set = True
        self.baseline.clear()

    def _restore(self, name: str) -> None:
        value = self.baseline.pop(name, None)
        self.applied.pop(name, None)
        self.run(f"SET {name} = {value if value is not None else 'DEFAULT'}")

    def _capture_baseline(self, name: str) -> None:
        result = self.run(
            "SELECT value FROM system.settings WHERE name = {n:String} AND changed",
            "JSONEachRow",
            {"n": name},
        )
        for line in result.bytes().splitlines():
            value = json.loads(line)["value"]
            # expression defaults such as 'auto(4)' come back already quoted
            quoted = len(value) >= 2 and value[0] == value[-1] == "'"
            self.baseline[name] = value if quoted else _sql_literal(value)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


@dataclass
class _Session:
    handle: _Handle
    timeout: float
    database: str  # what the client USEd in this session (else the default)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)


# The engine's in-memory caches, each a share of one budget (LOOM_CLICKHOUSE_CACHE_MB).
# At ClickHouse's server defaults they may grow to GiBs each (mark, primary-index,
# vector-index caches 5 GiB apiece, about 26 GiB in all), far beyond a small machine:
# here they sum to under the budget. The HNSW indexes get three quarters: a search above
# the exact-scan threshold needs each part's index in memory, and an index that does not
# fit is read back from disk at every search (measured: a 50k-vector index, 67.5 MB,
# 8 ms per search cached, 70 ms under a 32 MiB limit). A 384-dimension bf16 index takes
# about 1.35 kB per vector, so the default 1.5 GiB holds about 1.1 million vectors (a
# 1536-dimension one about 4 kB: some 400 thousand). The text-index, Parquet, Iceberg and
# unique-key caches serve nothing Loom does; they get a sliver so none is unbounded.
_CACHE_SHARES: dict[str, float] = {
    "vector_similarity_index_cache_size": 3 / 4,
    "mark_cache_size": 1 / 16,
    "primary_index_cache_size": 1 / 16,
    "index_mark_cache_size": 1 / 32,
    "query_condition_cache_size": 1 / 64,
    "compiled_expression_cache_size": 1 / 128,
    "text_index_header_cache_size": 1 / 128,
    "text_index_tokens_cache_size": 1 / 128,
    "text_index_postings_cache_size": 1 / 128,
    "parquet_metadata_cache_size": 1 / 128,
    "iceberg_metadata_files_cache_size": 1 / 128,
    "unique_key_index_cache_size_bytes": 1 / 128,
}
# Off, as at chdb's defaults, and kept off: the uncompressed-block caches copy what the
# OS page cache already holds. (chdb builds no query cache: its size stays 0 whatever
# is set, and use_query_cache is off.)
_CACHES_OFF = ("uncompressed_cache_size", "index_uncompressed_cache_size")


def engine_cache_settings(cache_mb: int = DEFAULT_CACHE_MB) -> dict[str, int]:
    """Byte limits of the engine's caches for a budget of `cache_mb` MiB (they sum to
    less than the budget)."""
    budget = cache_mb * 1024 * 1024
    limits = {name: int(budget * share) for name, share in _CACHE_SHARES.items()}
    return limits | dict.fromkeys(_CACHES_OFF, 0)


def engine_server_settings(cpus: int | None = None, cache_mb: int = DEFAULT_CACHE_MB) -> dict[str, int]:
    """Server settings the embedded engine starts with (a server's config.xml would hold
    them): the cache limits above, and the vector index builds' threads. The engine
    shares the machine with the API and the embedding model: a vector
    index build (at every merge of a vector table's parts) may take at most half of the
    cores. At its default (16 threads) a large merge took both cores of a 2-core machine
    for seconds, stalling the model: single-turn appends 64 % -> 68-69 % of the raw model,
    p99 344-367 -> 222-301 ms, measured back to back; batch ingest unchanged."""
    cores = cpus if cpus is not None else (os.cpu_count() or 2)
    threads = {"max_build_vector_similarity_index_thread_pool_size": max(1, cores // 2)}
    return threads | engine_cache_settings(cache_mb)


class _Engine:
    """Owns the chdb engine: an anchor connection that keeps it open, a pool of
    handles for sessionless requests, and one handle per session_id."""

    def __init__(self, data_dir: Path, cache_mb: int = DEFAULT_CACHE_MB):
        import chdb  # only here: TZ must be UTC before the engine loads

        self._connect = chdb.connect
        # chdb passes a file: URI's query parameters to the engine as server settings.
        options = "&".join(f"{k}={v}" for k, v in engine_server_settings(cache_mb=cache_mb).items())
        self._conn_str = f"file:{data_dir}?{options}"
        # chdb shuts the engine down when its last connection closes; this one
        # stays open for the endpoint's lifetime and is closed last.
        self._anchor = _Handle(self._connect(self._conn_str), "default")
        self.version = self._anchor.run("SELECT version()").bytes().decode().strip()
        self.default_database = self._anchor.run("SELECT currentDatabase()").bytes().decode().strip()
        self._lock = threading.Lock()
        self._idle: list[_Handle] = []
        self._sessions: dict[str, _Session] = {}
        self._closed = False

    def open_handle(self) -> _Handle:
        try:
            return _Handle(self._connect(self._conn_str), self.default_database)
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from None

    @contextlib.contextmanager
    def pooled_handle(self) -> Iterator[_Handle]:
        """A sessionless handle from the pool. One flagged `discard` (it ran
        SET/USE/CREATE TEMPORARY, or an insert into it failed) is closed, not reused."""
        with self._lock:
            handle = self._idle.pop() if self._idle else None
        if handle is None:
            handle = self.open_handle()
        reusable = False
        try:
            yield handle
            reusable = True
        except ClickHouseError:
            reusable = True  # an SQL error leaves the handle as it was
            raise
        finally:
            with self._lock:
                keep = (
                    reusable
                    and not handle.discard
                    and not self._closed
                    and len(self._idle) < _MAX_IDLE_HANDLES
                )
                if keep:
                    self._idle.append(handle)
            if not keep:
                handle.close()

    @contextlib.contextmanager
    def session(self, session_id: str, timeout: float, check: bool) -> Iterator[_Session]:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise ClickHouseError.of(_SESSION_NOT_FOUND, f"Session {session_id} not found")
                session = _Session(self.open_handle(), timeout, self.default_database)
                self._sessions[session_id] = session
            if not session.lock.acquire(blocking=False):
                raise ClickHouseError.of(
                    _SESSION_IS_LOCKED, f"Session {session_id} is locked by a concurrent client"
                )
        try:
            yield session
        finally:
            session.timeout = timeout
            session.last_used = time.monotonic()
            session.lock.release()

    def reap_sessions(self) -> None:
        """Close sessions idle past their session_timeout (as the server does)."""
        now = time.monotonic()
        expired: list[_Session] = []
        with self._lock:
            for sid, session in list(self._sessions.items()):
                if now - session.last_used > session.timeout and session.lock.acquire(blocking=False):
                    del self._sessions[sid]
                    expired.append(session)
        for session in expired:
            session.handle.close()

    def close(self) -> None:
        """After in-flight requests drained: close every handle, the anchor last,
        so chdb shuts the engine down cleanly."""
        with self._lock:
            self._closed = True
            handles = [s.handle for s in self._sessions.values()] + self._idle
            self._sessions.clear()
            self._idle = []
        for handle in handles:
            handle.close()
        self._anchor.close()


# --------------------------------------------------------------------------------------
# Executing one request on a handle
# --------------------------------------------------------------------------------------


@dataclass
class _Request:
    """One query request, as ClickHouse's HTTP handler sees it."""

    params: dict[str, str]  # URL (and form) parameters, last one wins
    query_param: bytes  # the `query` parameter, b"" if absent
    body: Iterator[bytes]  # decoded (decompressed) body chunks
    database: str | None
    default_format: str
    settings: dict[str, str]
    query_params: dict[str, str]  # param_NAME -> value, NAME without the prefix


@dataclass
class _Reply:
    body: bytes | memoryview
    fmt: str | None  # X-ClickHouse-Format: only for statements that return rows
    summary: dict[str, str]
    keepalive: Any = None  # the chdb objects whose memory `body` points into


def _request_from_params(params: dict[str, str], body: Iterator[bytes]) -> _Request:
    settings: dict[str, str] = {}
    query_params: dict[str, str] = {}
    for name, value in params.items():
        if name.startswith("param_"):
            query_params[name[6:]] = value
        elif name not in _TRANSPORT_PARAMS:
            settings[name] = value
    return _Request(
        params=params,
        query_param=params.get("query", "").encode(),
        body=body,
        database=params.get("database") or None,
        default_format=params.get("default_format") or "TabSeparated",
        settings=settings,
        query_params=query_params,
    )


def _execute(handle: _Handle, session: _Session | None, req: _Request) -> _Reply:
    first = _peek_statement(req)
    insert = _parse_insert_head(first) if _statement_kind(first).first == "INSERT" else None
    if insert is not None:
        _prepare(handle, session, req)
        return _stream_insert(handle, insert, first[insert.data_start :], req.body)
    sql = first + b"".join(req.body)
    if not sql.strip():
        raise ClickHouseError.of(_SYNTAX_ERROR, "Empty query")
    kind = _statement_kind(sql)
    if session is not None and kind.is_set:
        # SET changes the session itself: run it on the session's own settings,
        # without this request's URL overrides, and remember it was changed.
        handle.reset_settings()
        result = handle.run(sql, req.default_format, req.query_params)
        handle.note_user_set()
    else:
        _prepare(handle, session, req)
        result = handle.run(sql, req.default_format, req.query_params)
    if kind.is_use:
        handle.database = handle.run("SELECT currentDatabase()").bytes().decode().strip()
        if session is not None:
            session.database = handle.database
    if session is None and kind.changes_session_state:
        handle.discard = True
    fmt = _output_format(sql, req.default_format) if kind.returns_rows else None
    # No copy of the result: a view into chdb's buffer, which the reply keeps alive.
    wrapper = result.get_memview()
    return _Reply(wrapper.view(), fmt, _query_summary(result), keepalive=(result, wrapper))


def _peek_statement(req: _Request) -> bytes:
    """The start of the statement text: the `query` parameter plus "\\n", or (no
    parameter) enough of the body to see an INSERT's header. The body iterator
    keeps the rest, so an insert's data streams into chdb without being buffered."""
    if req.query_param:
        return req.query_param + b"\n"
    text = b""
    for chunk in req.body:
        text += chunk
        kind = _statement_kind(text)
        if kind.first != "INSERT" or _parse_insert_head(text) is not None or len(text) > _INSERT_HEAD_PEEK:
            break
    return text


def _prepare(handle: _Handle, session: _Session | None, req: _Request) -> None:
    """Database and settings for this request: the `database` parameter, else the
    session's USE, else the default; URL settings on top of the session's SETs."""
    default = session.database if session is not None else handle.default_database
    handle.use_database(req.database or default)
    handle.apply_settings(req.settings)


def _stream_insert(handle: _Handle, insert: _InsertHead, inline: bytes, rest: Iterator[bytes]) -> _Reply:
    # chdb's send_insert takes the data in pieces: reliable for binary formats
    # (query() with inline Native data is not) and never holds the whole body.
    try:
        inserter = handle.conn.send_insert(insert.statement, insert.fmt)
    except Exception as exc:
        raise ClickHouseError.from_engine(exc) from None
    finished = False
    try:
        for piece in _coalesce(itertools.chain([inline], rest), _INSERT_APPEND_MIN):
            inserter.append(piece)
        finished = True
        result = inserter.finish()
    except ClickHouseError:
        raise
    except (_BadRequest, OSError):
        raise
    except Exception as exc:
        raise ClickHouseError.from_engine(exc) from None
    finally:
        if not finished:
            handle.discard = True  # a half-fed insert: do not trust the handle again
            with contextlib.suppress(Exception):
                inserter.cancel()
    summary = _summary(
        written_rows=result.rows_written, written_bytes=result.bytes_written, elapsed_s=result.elapsed
    )
    return _Reply(b"", None, summary)


def _query_summary(result: Any) -> dict[str, str]:
    return _summary(
        read_rows=result.storage_rows_read(),
        read_bytes=result.storage_bytes_read(),
        written_rows=result.rows_written(),
        written_bytes=result.bytes_written(),
        result_rows=result.rows_read(),
        result_bytes=result.bytes_read(),
        elapsed_s=result.elapsed(),
    )


def _summary(
    *,
    read_rows: int = 0,
    read_bytes: int = 0,
    written_rows: int = 0,
    written_bytes: int = 0,
    result_rows: int = 0,
    result_bytes: int = 0,
    elapsed_s: float = 0.0,
) -> dict[str, str]:
    # The real server sends every number as a string.
    return {
        "read_rows": str(read_rows),
        "read_bytes": str(read_bytes),
        "written_rows": str(written_rows),
        "written_bytes": str(written_bytes),
        "total_rows_to_read": "0",
        "result_rows": str(result_rows),
        "result_bytes": str(result_bytes),
        "elapsed_ns": str(int(elapsed_s * 1e9)),
    }


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


class _Gate:
    """Counts in-flight requests; once closed, refuses new ones and lets shutdown
    wait for the running ones (so no acknowledged insert is cut off)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False

    def enter(self) -> bool:
        with self._cond:
            if self._closed:
                return False
            self._active += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def close_and_wait(self, timeout: float) -> bool:
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._active == 0, timeout)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block exit
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: _Engine):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.engine = engine
        self.gate = _Gate()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clickhouse-connect pools connections
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Without this, Nagle + delayed ACK add ~40 ms to a small response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # per-request logging would cost more than the request

    # -- dispatch ---------------------------------------------------------------

    def _dispatch(self) -> None:
        if not self.server.gate.enter():
            self.close_connection = True  # shutting down: the client retries elsewhere
            return
        try:
            url = urlsplit(self.path)
            if url.path == "/ping" or (
                url.path == "/" and self.command == "GET" and "query=" not in url.query
            ):
                self._send(200, [("Content-Type", "text/plain; charset=UTF-8")], b"Ok.\n")
            elif url.path == "/":
                self._query(url.query)
            else:
                self._send_error(ClickHouseError(0, f"There is no handle {url.path}\n"), status=404)
        except _BadRequest as exc:
            self.close_connection = True
            self._send_error(ClickHouseError(0, f"Bad request: {exc}"), status=400)
        except OSError:
            self.close_connection = True  # the client went away
        except Exception as exc:  # a bug here: report it like the server would, then reset
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._send_error(ClickHouseError.of(_UNKNOWN_EXCEPTION, f"{type(exc).__name__}: {exc}"))
        finally:
            self.server.gate.leave()

    def _query(self, url_query: str) -> None:
        raw = _raw_body(cast(BinaryIO, self.rfile), self.headers)
        params = dict(parse_qsl(url_query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        try:
            body = self._decoded_body(raw, params)
            req = _request_from_params(params, body)
            reply = self._run(req)
        except ClickHouseError as exc:
            self._drain(raw)
            self._send_error(exc, query_id=query_id)
            return
        self._drain(raw)
        self._send_reply(reply, params, query_id)

    def _decoded_body(self, raw: Iterator[bytes], params: dict[str, str]) -> Iterator[bytes]:
        """Body chunks after Content-Encoding / decompress=1; for a multipart form,
        its fields become parameters (mutating `params`) and the body is empty."""
        if params.get("compress") in ("1", "true"):
            raise ClickHouseError.of(
                _NOT_IMPLEMENTED,
                "compress=1 (ClickHouse block-compressed responses) "
                "is not supported by the embedded endpoint; use HTTP compression",
            )
        content_type = self.headers.get("Content-Type", "")
        if content_type.lower().startswith("multipart/form-data"):
            for name, filename, value in _parse_multipart(b"".join(raw), content_type):
                if filename is not None:
                    raise ClickHouseError.of(
                        _NOT_IMPLEMENTED, "External data is not supported by the embedded endpoint"
                    )
                params[name] = value.decode()
            return iter(())
        body: Iterator[bytes] = raw
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            body = _decode_body(body, encoding)
        if params.get("decompress") in ("1", "true"):
            body = _decode_native_blocks(body)
        return body

    def _run(self, req: _Request) -> _Reply:
        engine = self.server.engine
        session_id = req.params.get("session_id")
        if not session_id:
            with engine.pooled_handle() as handle:
                return _execute(handle, None, req)
        timeout = _session_timeout(req.params.get("session_timeout"))
        check = req.params.get("session_check") in ("1", "true")
        with engine.session(session_id, timeout, check) as session:
            return _execute(session.handle, session, req)

    # -- responses ----------------------------------------------------------------

    def _send_reply(self, reply: _Reply, params: dict[str, str], query_id: str) -> None:
        timezone = params.get("session_timezone") or "UTC"  # the engine runs with TZ=UTC
        headers = [
            ("X-ClickHouse-Query-Id", _header_safe(query_id)),
            ("X-ClickHouse-Timezone", _header_safe(timezone)),
            ("X-ClickHouse-Summary", json.dumps(reply.summary, separators=(",", ":"))),
        ]
        if reply.fmt is not None:
            headers.append(("X-ClickHouse-Format", reply.fmt))
            headers.append(("Content-Type", _content_type(reply.fmt)))
        else:
            headers.append(("Content-Type", "text/plain; charset=UTF-8"))
        body: bytes | memoryview = reply.body
        if len(body) and params.get("enable_http_compression") in ("1", "true"):
            encoding = _pick_response_encoding(self.headers.get("Accept-Encoding", ""))
            if encoding is not None:
                body = _compress_response(body, encoding)
                headers.append(("Content-Encoding", encoding))
        self._send(200, headers, body)

    def _send_error(
        self, exc: ClickHouseError, *, status: int | None = None, query_id: str | None = None
    ) -> None:
        headers = [
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Exception-Code", str(exc.code)),
        ]
        if query_id is not None:
            headers.append(("X-ClickHouse-Query-Id", _header_safe(query_id)))
        text = exc.text if exc.text.endswith("\n") else exc.text + "\n"
        self._send(status or exc.http_status, headers, text.encode())

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes | memoryview) -> None:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"X-ClickHouse-Server-Display-Name: {SERVER_DISPLAY_NAME}",
            *(f"{name}: {value}" for name, value in headers),
            f"Content-Length: {len(body)}",
            "Connection: close" if self.close_connection else "Connection: Keep-Alive",
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # One write for the usual small response: headers and body in separate
        # writes cost a round of delayed ACK on some stacks.
        if len(body) <= _SINGLE_WRITE_MAX:
            self.wfile.write(head + bytes(body))
        else:
            self.wfile.write(head)
            self.wfile.write(body)

    def _drain(self, raw: Iterator[bytes]) -> None:
        """Read what is left of the body so the keep-alive connection stays in sync
        (an error must reach the client as a response, not as a reset mid-upload)."""
        try:
            for _ in raw:
                pass
        except (_BadRequest, OSError, ValueError):
            self.close_connection = True


def _session_timeout(text: str | None) -> float:
    if not text:
        return DEFAULT_SESSION_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ClickHouseError.of(_INVALID_SESSION_TIMEOUT, f"Invalid session timeout: '{text}'") from None
    if not 0 < value <= MAX_SESSION_TIMEOUT_S:
        raise ClickHouseError.of(
            _INVALID_SESSION_TIMEOUT,
            f"Session timeout {text} is out of range (0, {MAX_SESSION_TIMEOUT_S:.0f}]",
        )
    return value


def _content_type(fmt: str) -> str:
    if fmt.startswith(("TabSeparated", "TSV")):
        return "text/tab-separated-values; charset=UTF-8"
    if fmt.startswith("CSV"):
        return "text/csv; charset=UTF-8"
    if fmt.startswith("JSON"):
        return "application/json; charset=UTF-8"
    return "application/octet-stream"


def _header_safe(value: str) -> str:
    return re.sub(r"[^\x20-\x7e]", "", value)[:256]


# --------------------------------------------------------------------------------------
# Process: arguments, data-dir lock, signals, graceful shutdown
# --------------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _take_lock(data_dir: Path) -> int | None:
    """flock DIR/endpoint.lock (held until the process exits, even on SIGKILL);
    None if another process holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _lock_owner(data_dir: Path) -> str:
    try:
        return (data_dir / LOCK_FILE).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _write_port_file(data_dir: Path, port: int) -> None:
    tmp = data_dir / f".{PORT_FILE}.{os.getpid()}"
    tmp.write_text(f"{port}\n")
    os.replace(tmp, data_dir / PORT_FILE)  # readers never see a half-written file


def _engine_query(engine: _Engine, sql: str) -> str:
    with engine.pooled_handle() as handle:
        return str(handle.run(sql).bytes().decode())


def _reap_loop(engine: _Engine, stop: threading.Event) -> None:
    """Every few seconds: close idle sessions, check the vector-index cache; every
    minute: release the allocator's free pages (loom.embedded.engine_housekeeping)."""
    trim = VectorCacheTrim()
    next_trim = next_release = time.monotonic()

    def query(sql: str) -> str:
        return _engine_query(engine, sql)

    while not stop.wait(1.0):
        engine.reap_sessions()
        now = time.monotonic()
        if now >= next_trim:
            next_trim = now + VECTOR_CACHE_CHECK_S
            _housekeeping_step("vector index cache check", lambda: trim.check(query))
        if now >= next_release:
            next_release = now + MEMORY_RELEASE_S
            _housekeeping_step("memory release", lambda: release_free_memory(query))


def _housekeeping_step(name: str, step: Callable[[], object]) -> None:
    """One step; whatever it raises is logged (its code or type only) and the next round
    tries again: an exception leaving the loop would stop the session reaping too."""
    try:
        step()
    except ClickHouseError as exc:
        print(f"{name} failed: {exc.code}", file=sys.stderr, flush=True)
    except Exception as exc:
        print(f"{name} failed: {type(exc).__name__}", file=sys.stderr, flush=True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loom.embedded.clickhouse_endpoint",
        description="Serve ClickHouse's HTTP interface over an embedded chdb engine.",
    )
    parser.add_argument(
        "--data-dir", required=True, type=Path, help="engine data directory (one endpoint per directory)"
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument(
        "--host", default="127.0.0.1", help="loopback address to bind (127.x, ::1, localhost)"
    )
    parser.add_argument(
        "--cache-mb",
        type=int,
        default=DEFAULT_CACHE_MB,
        help="the engine's caches together stay under this many MiB (LOOM_CLICKHOUSE_CACHE_MB)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if not _is_loopback(args.host):
        # chdb can read any local file (file(), INFILE): never expose it beyond this host.
        print(
            f"refusing --host {args.host}: the embedded ClickHouse endpoint listens on loopback only "
            "(127.x.x.x, ::1 or localhost)",
            file=sys.stderr,
        )
        return EXIT_BAD_ARGS
    host = "127.0.0.1" if args.host == "localhost" else args.host
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)

    lock_fd = _take_lock(data_dir)
    if lock_fd is None:
        print(
            f"another Loom ClickHouse endpoint already owns {data_dir} (pid {_lock_owner(data_dir)})",
            file=sys.stderr,
        )
        return EXIT_ALREADY_RUNNING

    os.environ["TZ"] = "UTC"  # before chdb loads: the engine's timezone is UTC
    time.tzset()
    try:
        engine = _Engine(data_dir, args.cache_mb)
    except Exception as exc:
        print(f"cannot open the ClickHouse engine on {data_dir}: {exc}", file=sys.stderr)
        return EXIT_ENGINE_FAILED
    try:
        server = _Server((host, args.port), engine)
    except OSError as exc:
        engine.close()
        print(f"cannot listen on {host}:{args.port}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    return _serve(server, engine, data_dir, host)


def _serve(server: _Server, engine: _Engine, data_dir: Path, host: str) -> int:
    # Signals only write to a pipe: the main thread does the shutdown work.
    wake_r, wake_w = os.pipe()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os.write(wake_w, b"x"))

    port = server.server_address[1]
    _write_port_file(data_dir, port)
    stop_reaper = threading.Event()
    threading.Thread(target=_reap_loop, args=(engine, stop_reaper), daemon=True).start()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    print(f"{LISTENING_PREFIX}{_url_host(host)}:{port}", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing else may reach the parent's pipe

    os.read(wake_r, 1)
    print(f"stopping the ClickHouse endpoint on {data_dir}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        (data_dir / PORT_FILE).unlink()
    server.shutdown()  # stop accepting
    server.server_close()
    if not server.gate.close_and_wait(DRAIN_TIMEOUT_S):
        # Closing chdb under a running query is not safe; what was acknowledged is
        # already on disk, so leave without closing it.
        print(
            f"in-flight requests still running after {DRAIN_TIMEOUT_S:.0f}s; exiting without "
            "closing the engine",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_DRAIN_TIMEOUT)
    stop_reaper.set()
    engine.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
