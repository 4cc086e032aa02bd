"""A TCP relay in front of a live backend, for tests that play that backend's death.

Clients connect through the relay's own port; `kill()` then makes that port refuse new
connections and cuts the ones it carried, which is what a client sees when the process
behind it dies, while the real backend keeps serving the rest of the suite."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlparse


class Relay:
    """A TCP relay to `target` (a URL) on a port of its own, until `kill()`."""

    def __init__(self, target: str) -> None:
        parsed = urlparse(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 8123)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
                self.open += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(): a close alone does not
        self.server.close()
        for s in self.open:  # shutdown first: a close alone leaves a blocked recv's socket open
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
