"""The read index's feed: the write events it applies, on one Redis stream.

Two kinds of event, each published by the one function every writer goes through, after
its write is durable and before the writer's op answers (so an answered write is on the
stream before any search that starts after the answer):

* ``e``: embedding rows inserted (loom.store.embeddings.insert): each row's key, version,
  owner, time, text, model and whether it is a live vector of a recorded turn (the
  vector itself travels as float32 bytes beside them). The index adds, replaces or drops
  the row by version.
* ``m``: search marks raised (loom.store.search_marks.raise_marks): every writer that
  rewrites or removes existing turns or embedding rows raises its threads' marks before
  and after its writes. The index re-reads those threads (or the namespace) from
  ClickHouse, which catches what no embedding-row insert carries (a lightweight DELETE,
  an erasure's INSERT ... SELECT).

The stream is trimmed to about STREAM_MAXLEN entries; an index that fell further behind
finds the gap and rebuilds. A failed publish never fails the write (it is durable): the
index misses the row until its next rebuild, and a search still verifies every turn a
raised mark doubts (loom.read_index.state).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import redis

from loom import redis_keys

log = logging.getLogger(__name__)

STREAM = redis_keys.READ_INDEX_EVENTS
STREAM_MAXLEN = 500_000
EMBEDDINGS = b"e"
MARKS = b"m"


@dataclass(frozen=True, slots=True)
class TurnCopy:
    """The turn copy an embedding row serves, at the row's version: what the feed, the
    index and a search candidate (loom.store.search.Candidate) each carry first."""

    namespace: str
    thread_id: str
    msg_id: str
    version: int
    agent: str
    role: str
    run_id: str
    user_id: str


@dataclass(frozen=True, slots=True)
class Row(TurnCopy):
    """An embedding row as the index keeps it (vector None: not a live recorded vector)."""

    ts_us: int
    text: str
    model: str
    vector: np.ndarray | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.thread_id, self.msg_id)


def _us(ts: datetime | None) -> int:
    if ts is None:
        return 0
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return int(ts.timestamp() * 1_000_000)


def _live_vector(row: Any) -> np.ndarray | None:
    """The row's vector when it is one search may rank: live, no error, a recorded
    turn's (the vector tables' own feed, migration 007)."""
    vec = row.embedding
    if row.tombstoned or row.error or row.origin != "recorded" or vec is None or len(vec) == 0:
        return None
    return np.asarray(vec, dtype=np.float32)


def _xadd(client: redis.Redis, fields: dict[bytes, bytes]) -> None:
    entry: dict[Any, Any] = fields  # redis-py annotates the fields with its own unions (invariant)
    client.xadd(STREAM, entry, maxlen=STREAM_MAXLEN, approximate=True)


def encode_rows(rows: Sequence[Any]) -> dict[bytes, bytes]:
    """An ``e`` event's fields for loom.store.embeddings rows."""
    meta: list[list[Any]] = []
    blobs: list[bytes] = []
    for r in rows:
        vec = _live_vector(r)
        dim = 0 if vec is None else int(vec.shape[0])
        if vec is not None:
            blobs.append(vec.astype("<f4", copy=False).tobytes())
        meta.append(
            [
                r.namespace,
                r.thread_id,
                r.msg_id,
                int(r.version),
                r.agent,
                r.role,
                r.run_id,
                r.user_id,
                _us(r.ts),
                r.text if dim else "",
                r.model,
                dim,
            ]
        )
    return {b"k": EMBEDDINGS, b"p": json.dumps(meta).encode(), b"v": b"".join(blobs)}


def decode_rows(fields: dict[bytes, bytes]) -> list[Row]:
    meta = json.loads(fields[b"p"])
    blob = fields.get(b"v", b"")
    out: list[Row] = []
    at = 0
    for ns, th, mid, ver, ag, role, run, user, ts_us, text, model, dim in meta:
        vec = None
        if dim:
            vec = np.frombuffer(blob, dtype="<f4", count=dim, offset=at)
            at += 4 * dim
        out.append(Row(ns, th, mid, int(ver), ag, role, run, user, int(ts_us), text, model, vec))
    return out


def encode_marks(pairs: Iterable[tuple[str, str]], mark: int) -> dict[bytes, bytes]:
    return {b"k": MARKS, b"p": json.dumps([[ns, th] for ns, th in pairs]).encode(), b"m": str(mark).encode()}


def decode_marks(fields: dict[bytes, bytes]) -> tuple[list[tuple[str, str]], int]:
    return [(ns, th) for ns, th in json.loads(fields[b"p"])], int(fields[b"m"])


class _Sink:
    """The process's publisher for writers that run in worker threads (the store layer)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def publish(self, fields: dict[bytes, bytes]) -> None:
        _xadd(self.client, fields)


_SINK: _Sink | None = None


def attach(redis_url: str) -> None:
    """Publish this process's embedding-row inserts (open_services, when the index is on)."""
    global _SINK
    _SINK = _Sink(redis_url)


def detach() -> None:
    global _SINK
    _SINK = None


def embeddings_written(rows: Sequence[Any]) -> None:
    """Called by loom.store.embeddings.insert once its rows are durable."""
    sink = _SINK
    if sink is None or not rows:
        return
    try:
        sink.publish(encode_rows(rows))
    except Exception:  # noqa: BLE001 - the rows are durable; the index rebuilds (module docstring)
        log.warning("read index: an embedding event was not published", exc_info=True)


def announce_rewritten(redis_url: str, namespaces: Iterable[str]) -> None:
    """For a writer that goes around Loom's store functions (a bulk load straight into
    the tables, a TRUNCATE): the index reads these namespaces again from ClickHouse. Such
    a load calls it once its rows are durable, as it calls
    loom.store.transcript_postings.backfill for the postings."""
    client = redis.Redis.from_url(redis_url)
    try:
        fields = encode_marks([(ns, "") for ns in namespaces], time.time_ns())
        _xadd(client, fields)
    finally:
        client.close()


async def marks_raised(client: Any, pairs: Sequence[tuple[str, str]], mark: int) -> None:
    """Called by loom.store.search_marks.raise_marks once the raise is in Redis."""
    if _SINK is None or not pairs:
        return
    await client.xadd(STREAM, encode_marks(pairs, mark), maxlen=STREAM_MAXLEN, approximate=True)
