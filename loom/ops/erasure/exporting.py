"""erasure.export (admin): everything Loom holds of one user, as NDJSON, streamed.

Lines, in order: a header (``kind: "export"``), the user's transcript rows with their
metadata and saved flags (``kind: "turn"``; tombstoned ones included unless
``include_tombstoned: false``), their briefs (``kind: "brief"``) and the briefs'
revisions (``kind: "brief_revision"``), their memory: facts (``kind: "memory"``, the
fact's own kind as ``fact_kind``), the evidence extractions read (``kind:
"memory_evidence"``; both with forgotten ones unless ``include_tombstoned: false``)
and the extraction decisions (``kind: "memory_decision"``), the records of the user's
turns redacted or removed one by one (``kind: "redaction"``: the turn's key, ``action``
redacted or deleted, the placeholder, how many spans, when and by which token; never
the removed text), then a trailer (``kind: "end"``, with the count of rows). Embedding rows and fact vectors are never exported:
the excerpt an embedding row keeps of a turn the retention TTL expired is erased with
the user but is not in the export.

Memory stays bounded whatever the user's size: each table is read in key order,
a page at a time, and each page is formatted by ClickHouse itself (JSONEachRow) and
passed through as bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Forbidden, InvalidRequest
from loom.services import Services
from loom.store import export as store

PAGE_ROWS = 20_000


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"


def export(
    svc: Services,
    who: Principal,
    user_id: str,
    namespaces: Sequence[str] | None,
    *,
    include_tombstoned: bool = True,
    page_rows: int = PAGE_ROWS,
) -> AsyncIterator[bytes]:
    """Check role and namespaces now (before any byte is sent), then stream."""
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot export", rule="read_scope")
    if not user_id:
        raise InvalidRequest("user_id must not be empty", field="user_id", rule="non_empty")
    nss = list(dict.fromkeys(who.namespace(n) for n in namespaces)) if namespaces else list(who.namespaces)
    return _stream(svc, user_id, nss, include_tombstoned, page_rows)


def header(user_id: str, nss: list[str], include_tombstoned: bool) -> bytes:
    return _line(
        {
            "kind": "export",
            "user_id": user_id,
            "namespaces": nss,
            "include_tombstoned": include_tombstoned,
            "at": utcnow().isoformat(),
        }
    )


def trailer(rows: int) -> bytes:
    return _line({"kind": "end", "rows": rows})


async def _stream(
    svc: Services, user_id: str, nss: list[str], include_tombstoned: bool, page_rows: int
) -> AsyncIterator[bytes]:
    yield header(user_id, nss, include_tombstoned)
    rows = 0
    chunks = store.user_rows(svc.ch, user_id, nss, include_tombstoned, page_rows)
    async for body, n in svc.ahead(chunks):
        rows += n
        yield body
    yield trailer(rows)


__all__ = ["PAGE_ROWS", "export", "header", "trailer"]
