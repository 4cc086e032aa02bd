"""A local webhook receiver for tests: a threaded stdlib HTTP server on 127.0.0.1 that
records every POST (its time, headers and raw body) and answers from a script: the
first `fail_first` requests get `fail_status` (500 by default), the rest 200, each after
`delay_s` seconds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    at: float
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


class Receiver:
    def __init__(
        self, *, fail_first: int = 0, fail_status: int = 500, location: str = "", delay_s: float = 0.0
    ) -> None:
        self.fail_first, self.fail_status, self.location = fail_first, fail_status, location
        self.delay_s = delay_s  # before answering (a receiver too slow for the timeout)
        self.received: list[Received] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner._lock:
                    owner.received.append(
                        Received(
                            time.monotonic(), self.path, {k.lower(): v for k, v in self.headers.items()}, body
                        )
                    )
                    failing = len(owner.received) <= owner.fail_first
                status = owner.fail_status if failing else 200
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                self.send_response(status)
                if owner.location and 300 <= status < 400:
                    self.send_header("Location", owner.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
