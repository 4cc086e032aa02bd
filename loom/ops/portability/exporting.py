"""export.start (admin): a namespace, one user's rows or one thread, in Loom's export
format (docs/export-format.md), streamed and compressed, with a checksum.

The stream: a header line (format, its version, Loom's version, when, the namespace,
the scope, the count of each kind), then the rows kind by kind, each kind in key order
(the namespace's settings, threads, turns, redaction records, briefs, brief revisions,
facts, evidence, extraction decisions), then an end line with the count of body lines
and the SHA-256 of their bytes. Tombstoned rows are in it, shown as such; a removed
text is not (it is gone from the store). Never a vector, a version or a token secret.

Memory stays flat whatever the namespace's size: each kind is read a page at a time
(the next page read while this one is formatted and sent), each page formatted by
orjson and compressed as it goes (gzip or zstd), and only the compressor's buffer is
held between pages.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import orjson
import zstandard

from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Forbidden, InvalidRequest
from loom.models.portability import FORMAT_NAME, FORMAT_VERSION
from loom.services import Services
from loom.store import portability as store

PAGE_ROWS = 5_000
_OPTS = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z


def loom_version() -> str:
    try:
        return metadata.version("loom")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


@dataclass(frozen=True)
class Export:
    scope: store.Scope
    compression: str
    page_rows: int = PAGE_ROWS


def prepare(
    who: Principal,
    namespace: str,
    *,
    user_id: str | None = None,
    thread_id: str | None = None,
    agent: str | None = None,
    compression: str = "gzip",
    page_rows: int = PAGE_ROWS,
) -> Export:
    """Check role, scope and namespace before any byte is sent."""
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot export", rule="read_scope")
    if user_id is not None and thread_id is not None:
        raise InvalidRequest("export a user or a thread, not both", field="thread_id", rule="one_scope")
    if agent is not None and thread_id is None:
        raise InvalidRequest(
            "agent narrows a thread's export: give thread_id", field="agent", rule="with_thread"
        )
    ns = who.namespace(namespace)
    return Export(store.Scope(ns, user_id, thread_id, agent), compression, page_rows)


def line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj, option=_OPTS) + b"\n"


def _loads(raw: str) -> Any:
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}


def format_page(kind: store.Kind, page: store.Page) -> bytes:
    """One page as NDJSON lines; the JSON text columns as JSON values."""
    names = page.names
    json_at = [i for i, n in enumerate(names) if n in kind.json_fields]
    out = bytearray()
    head = {"kind": kind.kind}
    for values in page.rows:
        row = dict(zip(names, values, strict=True))
        for i in json_at:
            row[names[i]] = _loads(row[names[i]])
        out += orjson.dumps(head | row, option=_OPTS)
        out += b"\n"
    return bytes(out)


def _compressor(kind: str) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    if kind == "gzip":
        z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip member
        return z.compress, z.flush
    if kind == "zstd":
        c = zstandard.ZstdCompressor(level=3).compressobj()
        return c.compress, c.flush
    return (lambda b: b), (lambda: b"")


def body(svc: Services, export: Export) -> Iterator[tuple[bytes, int]]:
    """The body lines (blocking: run on the store's thread pool), a page at a time, with
    each page's row count."""
    scope = export.scope
    if scope.thread_id is None:
        settings = store.namespace_settings(svc.ch, scope.namespace)
        if settings is not None and scope.user_id is None:
            yield line({"kind": "namespace", **settings}), 1
    for kind in store.kinds_in(scope):
        after: tuple[Any, ...] | None = None
        while True:
            page = store.page(svc.ch, kind, scope, after, export.page_rows)
            if page.rows:
                yield format_page(kind, page), len(page.rows)
            if len(page.rows) < export.page_rows:
                break
            after = page.last


def counts(svc: Services, export: Export) -> dict[str, int]:
    scope = export.scope
    out = {k.kind: store.count(svc.ch, k, scope) for k in store.kinds_in(scope)}
    if scope.thread_id is None and scope.user_id is None:
        out = {"namespace": int(store.namespace_settings(svc.ch, scope.namespace) is not None)} | out
    return out


def header(export: Export, counted: dict[str, int], at: datetime | None = None) -> bytes:
    s = export.scope
    scope = {k: v for k, v in (("user_id", s.user_id), ("thread_id", s.thread_id), ("agent", s.agent)) if v}
    return line(
        {
            "kind": "header",
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "loom_version": loom_version(),
            "exported_at": (at or utcnow()).astimezone(UTC),
            "namespace": s.namespace,
            "scope": scope,
            "counts": counted,
        }
    )


async def stream(svc: Services, export: Export) -> AsyncIterator[bytes]:
    """The compressed export. Each page is read off the event loop, the next one while
    this one is compressed and sent; at most two pages are held at a time."""
    compress, flush = _compressor(export.compression)
    counted = await svc.run(counts, svc, export)
    yield compress(header(export, counted))
    digest, rows = hashlib.sha256(), 0
    async for chunk, n in svc.ahead(body(svc, export)):
        digest.update(chunk)
        rows += n
        out = compress(chunk)
        if out:
            yield out
    yield compress(line({"kind": "end", "rows": rows, "sha256": digest.hexdigest()})) + flush()


__all__ = ["Export", "line", "prepare", "stream"]
