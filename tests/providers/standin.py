"""A local stand-in for an OpenAI-compatible server, for testing real clients over HTTP.

A threaded stdlib HTTP server on 127.0.0.1 (a free port) that speaks
``POST /v1/embeddings`` and ``POST /v1/chat/completions``. By default it answers well;
a test scripts other behaviour per request, and every request is recorded::

    with StandInServer() as srv:
        srv.enqueue(srv.CHAT, Reply.error(500, "boom"))          # the next chat request only
        srv.enqueue(srv.EMBEDDINGS, Reply.malformed())
        srv.enqueue(srv.CHAT, srv.chat_ok("late").delayed(2.0))  # answers after 2 s
        srv.set_handler(srv.CHAT, lambda req: srv.chat_ok(f"echo {req.json['model']}"))
        client_under_test(base_url=srv.url) ...
        srv.requests_to(srv.CHAT)[-1].json["model"]               # what the client sent

Queued replies (``enqueue``) are used first, one per request, in order; then the path's
handler (``set_handler``); then the default good answer. A queued item or handler is a
:class:`Reply` or a function ``(RecordedRequest) -> Reply``.

Good answers: embeddings are deterministic per text (:func:`embedding_for`, deliberately
*not* unit length, so clients must normalise); chat content is ``chat_reply`` (a str or
a function of the request), by default ``"stand-in reply to: <last user message>"``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

__all__ = ["RecordedRequest", "Reply", "StandInServer", "embedding_for"]


def embedding_for(text: str, dim: int = 384) -> list[float]:
    """The stand-in's deterministic (unnormalised, norm about 3*sqrt(dim)) vector for ``text``."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    vec = np.random.default_rng(seed).normal(0.0, 3.0, size=dim)
    return [float(x) for x in vec]


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    received_at: float

    @property
    def json(self) -> Any:
        """The body parsed as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None


@dataclass(frozen=True)
class Reply:
    """What the stand-in sends back: status, body bytes, content type, and an optional delay."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Reply:
        return cls(status=status, body=json.dumps(obj).encode())

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Reply:
        return cls(status=status, body=text.encode(), content_type=content_type)

    @classmethod
    def error(cls, status: int, message: str = "stand-in error", type: str = "server_error") -> Reply:
        """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
        return cls.json({"error": {"message": message, "type": type, "code": status}}, status=status)

    @classmethod
    def malformed(cls, status: int = 200) -> Reply:
        """A body that claims to be JSON and is not."""
        return cls(status=status, body=b'{"data": [{"embedding": [0.1, 0.2')

    def delayed(self, seconds: float) -> Reply:
        return replace(self, delay=seconds)


Handler = Callable[[RecordedRequest], Reply]


class StandInServer:
    EMBEDDINGS = "/v1/embeddings"
    CHAT = "/v1/chat/completions"

    def __init__(
        self,
        *,
        embedding_dim: int = 384,
        chat_reply: str | Callable[[RecordedRequest], str] | None = None,
        api_key: str | None = None,
    ) -> None:
        """``api_key``: when set, requests without ``Authorization: Bearer <api_key>`` get a 401."""
        self.embedding_dim = embedding_dim
        self.chat_reply = chat_reply
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str, deque[Reply | Handler]] = {}
        self._handlers: dict[str, Reply | Handler] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._ids = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> StandInServer:
        if self._server is not None:
            return self
        owner = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner._conns.add(self.connection)

            def finish(self) -> None:
                with owner._lock:
                    owner._conns.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                owner._serve(self)

            def do_GET(self) -> None:
                owner._serve(self)

        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()  # ends any scripted delay early
        server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stand-in server is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, without ``/v1`` (clients add it)."""
        return f"http://127.0.0.1:{self.port}"

    # -- scripting -------------------------------------------------------------------

    def enqueue(self, path: str, *replies: Reply | Handler) -> None:
        """Replies for the next requests to ``path``, one per request, in order."""
        with self._lock:
            self._queues.setdefault(path, deque()).extend(replies)

    def set_handler(self, path: str, handler: Reply | Handler | None) -> None:
        """The answer for every request to ``path`` once its queue is empty (None: the good default)."""
        with self._lock:
            if handler is None:
                self._handlers.pop(path, None)
            else:
                self._handlers[path] = handler

    def reset(self) -> None:
        with self._lock:
            self._queues.clear()
            self._handlers.clear()
            self.requests.clear()

    def requests_to(self, path: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # -- good answers (usable from custom handlers) ----------------------------------

    def embeddings_ok(self, req: RecordedRequest, *, dim: int | None = None, reverse: bool = False) -> Reply:
        """A correct embeddings answer for ``req``; ``reverse`` lists data in reverse index order."""
        body = req.json
        inputs = body.get("input") if isinstance(body, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            return Reply.error(400, "'input' must be a string or a list of strings", "invalid_request_error")
        d = dim or self.embedding_dim
        data = [
            {"object": "embedding", "index": i, "embedding": embedding_for(t, d)}
            for i, t in enumerate(inputs)
        ]
        if reverse:
            data.reverse()
        return Reply.json(
            {
                "object": "list",
                "data": data,
                "model": body.get("model") if isinstance(body, dict) else None,
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }
        )

    def chat_ok(self, content: str | None = None, *, req: RecordedRequest | None = None) -> Reply:
        """A correct chat completion answering ``content`` (default: from ``chat_reply``)."""
        body = req.json if req is not None else None
        if content is None:
            if callable(self.chat_reply) and req is not None:
                content = self.chat_reply(req)
            elif isinstance(self.chat_reply, str):
                content = self.chat_reply
            else:
                content = "stand-in reply to: " + _last_user(body)
        return Reply.json(
            {
                "id": f"chatcmpl-standin-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") if isinstance(body, dict) else "stand-in",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )

    def _default(self, req: RecordedRequest) -> Reply:
        if req.method != "POST":
            return Reply.error(405, f"{req.method} not allowed", "invalid_request_error")
        if req.path == self.EMBEDDINGS:
            return self.embeddings_ok(req)
        if req.path == self.CHAT:
            if not isinstance(req.json, dict) or not isinstance(req.json.get("messages"), list):
                return Reply.error(400, "'messages' must be a list", "invalid_request_error")
            return self.chat_ok(req=req)
        return Reply.error(404, f"no route {req.path}", "not_found")

    # -- serving ---------------------------------------------------------------------

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        path = h.path.split("?", 1)[0]
        req = RecordedRequest(
            method=h.command,
            path=path,
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
            received_at=time.monotonic(),
        )
        with self._lock:
            self.requests.append(req)
            queue = self._queues.get(path)
            scripted: Reply | Handler | None = queue.popleft() if queue else self._handlers.get(path)
        try:
            if self.api_key is not None and req.bearer != self.api_key:
                reply = Reply.error(401, "Incorrect API key provided", "invalid_request_error")
            elif scripted is None:
                reply = self._default(req)
            elif isinstance(scripted, Reply):
                reply = scripted
            else:
                reply = scripted(req)
        except Exception as exc:  # a broken test handler: say so instead of hanging the client
            reply = Reply.error(500, f"stand-in handler raised {type(exc).__name__}: {exc}")
        if reply.delay > 0 and self._stopping.wait(reply.delay):
            h.close_connection = True
            return  # the server is stopping
        try:
            h.send_response(reply.status)
            h.send_header("Content-Type", reply.content_type)
            h.send_header("Content-Length", str(len(reply.body)))
            for k, v in reply.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(reply.body)
            h.wfile.flush()
        except OSError:
            pass  # the client gave up (e.g. its timeout fired during the delay)


def _last_user(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        for m in reversed(body["messages"]):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return str(m["content"])
    return ""
