"""A lean HTTP/1.1 keep-alive JSON client for the load generator.

Why not ``httpx.AsyncClient`` for the timed load: on this 2-core box httpx costs the client
~1-3 ms of CPU per request and its shared connection pool degrades with concurrency (measured:
~300 req/s against a FastAPI ``/healthz`` that serves ~5,900 req/s to this client at 32
connections). The client shares the cores with the servers, so with httpx the harness would
mostly measure itself and squeeze every ratio towards 1. This client does the minimum: one
persistent connection per concurrent caller, a request written in one ``write``, the response
read by Content-Length (or chunked). ``python -m bench --client httpx`` runs the load with
httpx instead, for comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any
from urllib.parse import urlsplit


class HttpError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


#: Idle connections older than this are not reused: servers close idle keep-alive connections
#: (uvicorn after 5 s), and a request written into a closing socket is lost.
MAX_IDLE_SECONDS = 2.0


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class LeanClient:
    """``await client.post_json(path, body)`` -> decoded JSON; raises :class:`HttpError` on >= 400."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 120.0) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError("LeanClient speaks plain http only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {self.host}:{self.port}\r\n{extra}Content-Type: application/json\r\n"
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        r, w = await asyncio.open_connection(self.host, self.port)
        return _Conn(r, w)

    async def post_json(self, path: str, body: Any) -> Any:
        payload = json.dumps(body, separators=(",", ":")).encode()
        req = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        for attempt in (0, 1):
            conn = self._take() if attempt == 0 else None
            if conn is None:
                conn = await self._connect()
            try:
                status, data, keep = await asyncio.wait_for(self._roundtrip(conn, req), self.timeout)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.close()
                if attempt == 0:  # a keep-alive connection the server closed: once more on a new one
                    continue
                raise ConnectionError(f"connection failed: {exc}") from exc
            except BaseException:
                conn.close()
                raise
            if keep:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()
            text = data.decode("utf-8", "replace")
            if status >= 400:
                raise HttpError(status, text)
            return json.loads(text) if text else None
        raise AssertionError("unreachable")

    def _take(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < MAX_IDLE_SECONDS:
                return conn
            conn.close()
        return None

    @staticmethod
    async def _roundtrip(conn: _Conn, req: bytes) -> tuple[int, bytes, bool]:
        conn.writer.write(req)
        head = await conn.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            data = await conn.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await conn.reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    await conn.reader.readuntil(b"\r\n")
                    break
                parts.append(await conn.reader.readexactly(size))
                await conn.reader.readexactly(2)
            data = b"".join(parts)
        else:
            data = await conn.reader.read()
            return status, data, False
        keep = headers.get("connection", "").lower() != "close"
        return status, data, keep

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
