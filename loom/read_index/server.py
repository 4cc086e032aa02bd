"""The read index's process: follows the event stream, loads namespaces, answers searches
on a unix socket (loom.read_index.client speaks to it).

Start: the stream's newest position is recorded first (the watermark), then every
namespace is loaded from ClickHouse in the background; the events after the watermark
are applied as they come, so a row written while a namespace loads is either in the
read or in an event (or both: versions decide). The stream is read twice over: a
blocking read keeps the index current between searches (its lag is measured: the
event's position is Redis's clock when it was added), and every search first reads
whatever the stream holds past the index's position (one read shared by the searches
that arrive meanwhile), so an answered write is never missing from a search that starts
after its answer. A gap (the stream trimmed past the index's position, or a Redis that
lost it) forgets everything held and loads it again.

Wire format: a request is two length-prefixed parts (little-endian u32 lengths): a JSON
header and the query vector as float32 bytes; the answer is one length-prefixed JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client
from redis.asyncio import Redis

from loom.read_index import feed
from loom.read_index.feed import Row
from loom.read_index.state import ReadIndex
from loom.read_index.vectors import Wanted
from loom.store import read_index as store
from loom.store import search_marks

log = logging.getLogger(__name__)

SYNC_BATCH = 5_000
SYNC_BUDGET_S = 0.25  # a search's catch-up longer than this answers "behind"
BLOCK_MS = 1_000


def _id(raw: bytes | str) -> tuple[int, int]:
    s = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def _text(pos: tuple[int, int]) -> str:
    return f"{pos[0]}-{pos[1]}"


class IndexServer:
    def __init__(self, ch: Client, redis: Redis, budget_bytes: int) -> None:
        self.ch = ch
        self.redis = redis
        self.executor = ThreadPoolExecutor(4, "read-index")
        self.index = ReadIndex(self._read, budget_bytes)
        self.position = (0, 0)
        self.started = time.monotonic()
        self._sync: asyncio.Future[bool] | None = None
        self._next_sync: asyncio.Future[bool] | None = None
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._clients: set[asyncio.StreamWriter] = set()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _read(self, ns: str, thread: str | None) -> list[Row]:
        return list(await self._run(store.rows, self.ch, ns, thread))

    # -- start ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.position = await self._newest()
        await self._list()
        self._tasks = [
            asyncio.ensure_future(self.index.loader()),
            asyncio.ensure_future(self._follow()),
        ]

    async def _list(self) -> None:
        """Load every namespace with rows, largest first (after the watermark: module docstring)."""
        counts = await self._run(store.namespaces, self.ch)
        self.index.listing(sorted(counts, key=lambda ns: -counts[ns]))

    async def _newest(self) -> tuple[int, int]:
        """The stream's newest position (the watermark a rebuild starts from); a stream
        that does not exist yet gets one entry, so the position is a real entry."""
        with contextlib.suppress(Exception):
            info = await self.redis.xinfo_stream(feed.STREAM)
            return _id(info["last-generated-id"])
        return _id(await self.redis.xadd(feed.STREAM, {b"k": b"start"}))

    async def close(self) -> None:
        for w in self._clients:
            w.close()
        tasks = [*self._tasks, *self.index._tasks]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        self.executor.shutdown(wait=False)

    # -- the stream ----------------------------------------------------------------------

    async def _follow(self) -> None:
        """Apply events as they come (between searches), checking for gaps."""
        redis = Redis(connection_pool=self.redis.connection_pool)
        while True:
            try:
                await self._gap_check()
                got = await redis.xread({feed.STREAM: _text(self.position)}, count=SYNC_BATCH, block=BLOCK_MS)
                async with self._lock:
                    self._apply(got)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis away: searches fall back meanwhile
                log.warning("read index: the stream could not be read", exc_info=True)
                await asyncio.sleep(0.5)

    async def _gap_check(self) -> None:
        try:
            info = await self.redis.xinfo_stream(feed.STREAM)
        except Exception:  # noqa: BLE001 - no stream: Redis lost it
            info = None
        first = _id(info["first-entry"][0]) if info and info.get("first-entry") else None
        newest = _id(info["last-generated-id"]) if info else (0, 0)
        if newest < self.position or (first is not None and first > self.position):
            log.warning("read index: a gap in the stream; loading everything again")
            self.position = await self._newest()
            self.index.forget_all()
            await self._list()

    def _apply(self, got: Any) -> int:
        n = 0
        for _stream, entries in got or []:
            for raw_id, fields in entries:
                pos = _id(raw_id)
                if pos <= self.position:
                    continue
                kind = fields.get(b"k")
                if kind == feed.EMBEDDINGS:
                    self.index.apply_rows(feed.decode_rows(fields), pos[0])
                elif kind == feed.MARKS:
                    pairs, _ = feed.decode_marks(fields)
                    self.index.apply_marks(pairs, pos[0])
                self.position = pos
                n += 1
        return n

    async def catch_up(self) -> bool:
        """Apply everything the stream holds now (one read shared by the searches that
        arrive while one runs: a search waits for a read that began after it arrived)."""
        if self._sync is None or self._sync.done():
            self._sync = asyncio.ensure_future(self._drain())
            return await asyncio.shield(self._sync)
        if self._next_sync is None or self._next_sync.done():
            running = self._sync

            async def after() -> bool:
                with contextlib.suppress(Exception):
                    await running
                return await self._drain()

            self._next_sync = asyncio.ensure_future(after())
            self._sync = self._next_sync
        return await asyncio.shield(self._next_sync)

    async def _drain(self) -> bool:
        deadline = time.monotonic() + SYNC_BUDGET_S
        while True:
            got = await self.redis.xread({feed.STREAM: _text(self.position)}, count=SYNC_BATCH)
            async with self._lock:
                n = self._apply(got)
            if n < SYNC_BATCH:
                return True
            if time.monotonic() > deadline:
                return False

    # -- searches ------------------------------------------------------------------------

    async def search(self, header: dict[str, Any], vector: np.ndarray) -> dict[str, Any]:
        if not await self.catch_up():
            return {"status": "behind"}
        f = header.get("filters") or {}
        wanted = Wanted(f.get("thread_id"), f.get("run_id"), f.get("role"), f.get("agent"), f.get("model"))
        found, missing = self.index.search(list(header["namespaces"]), vector, wanted, int(header["limit"]))
        pairs = sorted({(ns, r.thread_id) for ns, r in found})
        marks = await search_marks.read(self.redis, self.ch, self._run, pairs) if pairs else {}
        now = time.time_ns()
        return {
            "status": "ok",
            "missing": missing,
            "rows": [
                [ns, *r.values(), self.index.trusted(ns, r.thread_id, marks.get((ns, r.thread_id), -1), now)]
                for ns, r in found
            ],
        }

    def stats(self) -> dict[str, Any]:
        s = self.index.stats
        return {
            "status": "ok",
            "bytes": self.index.nbytes,
            "budget_bytes": self.index.budget,
            "rows": self.index.rows,
            "namespaces": len(self.index.held),
            "loading": len(self.index.loading) + len(self.index.queue),
            "events": s.events,
            "lag_p50_ms": s.lag_p(50),
            "lag_p99_ms": s.lag_p(99),
            "searches": s.searches,
            "served": s.served,
            "missed": s.missed,
            "loads": s.loads,
            "last_load_s": s.last_load_s,
            "last_load_rows": s.last_load_rows,
            "gaps": s.gaps,
            "position": _text(self.position),
        }

    # -- the socket ----------------------------------------------------------------------

    async def serve(self, path: Path) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return await asyncio.start_unix_server(self._client, path=str(path))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                try:
                    sizes = await reader.readexactly(8)
                except asyncio.IncompleteReadError:
                    return
                hlen, vlen = struct.unpack("<II", sizes)
                header = json.loads(await reader.readexactly(hlen))
                vector = np.frombuffer(await reader.readexactly(vlen), dtype="<f4") if vlen else np.zeros(0)
                try:
                    if header.get("op") == "stats":
                        answer = self.stats()
                    else:
                        answer = await self.search(header, vector)
                except Exception:  # noqa: BLE001 - the caller reads the engine instead
                    log.exception("read index: a search failed")
                    answer = {"status": "error"}
                body = json.dumps(answer).encode()
                writer.write(struct.pack("<I", len(body)) + body)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._clients.discard(writer)
            writer.close()
