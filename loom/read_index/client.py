"""The API's side of the read index: a few unix-socket connections to its process.

Every failure (no socket, a refused or broken connection, an answer later than
TIMEOUT_S) is an answer of None: the caller reads the engine and says why. A connection
that failed is dropped, and the next call opens a new one, so an index that restarts is
used again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loom.services import Services, Slot

TIMEOUT_S = 2.0
POOL = 64  # idle connections kept (a search holds one while it waits)


@dataclass
class IndexClient:
    path: str
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def call(self, header: dict[str, Any], vector: np.ndarray | None = None) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(self._call(header, vector), TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None

    async def _call(self, header: dict[str, Any], vector: np.ndarray | None) -> dict[str, Any]:
        conn = self.idle.pop() if self.idle else await asyncio.open_unix_connection(self.path)
        reader, writer = conn
        try:
            h = json.dumps(header).encode()
            v = b"" if vector is None else np.asarray(vector, dtype="<f4").tobytes()
            writer.write(struct.pack("<II", len(h), len(v)) + h + v)
            await writer.drain()
            (n,) = struct.unpack("<I", await reader.readexactly(4))
            answer: dict[str, Any] = json.loads(await reader.readexactly(n))
        except BaseException:
            writer.close()
            raise
        if len(self.idle) < POOL:
            self.idle.append(conn)
        else:
            writer.close()
        return answer

    async def close(self) -> None:
        while self.idle:
            _, writer = self.idle.pop()
            with contextlib.suppress(Exception):
                writer.close()


_CLIENT: Slot[IndexClient] = Slot("read_index.client")


def of(svc: Services) -> IndexClient | None:
    """The process's client of the index LOOM_READ_INDEX_SOCKET names (None: no index)."""
    path = svc.settings.read_index_socket
    if not path or svc.settings.read_index_mb <= 0:
        return None
    client = _CLIENT.get(svc)
    if client is None or client.path != path:
        client = _CLIENT.put(svc, IndexClient(path))
    return client
