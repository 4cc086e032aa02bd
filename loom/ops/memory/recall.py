"""memory.recall (viewer): lexical and time-window reads over the scope's evidence, the
messages and observations extractions read (loom.memory_evidence). They exist whether
or not the namespace records conversations; recorded turns are never read here.

With a `query`, evidence is ranked by BM25 over its whole text (per-query statistics
over the scope's readable evidence) inside the window; without one, the window's
evidence is listed newest first. Evidence that reads as high keeps no text and is
never an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.auth.principal import Principal, Role
from loom.errors import ConflictingFields
from loom.models.memory import RecallRequest
from loom.ops.memory.common import scope_of, search_evidence
from loom.services import Services
from loom.store import evidence as ev_store
from loom.store.evidence import Evidence


@dataclass
class RecallHit:
    evidence: Evidence
    score: float | None
    matched: list[str]


async def recall(svc: Services, who: Principal, req: RecallRequest) -> list[RecallHit]:
    who.require_role(Role.viewer)
    scope = scope_of(who, req)
    query, limit, window = req.query, req.limit, ev_store.Window(req.since, req.until)
    if req.since is not None and req.until is not None and req.since >= req.until:
        raise ConflictingFields("since must be before until", fields=["since", "until"], rule="window")
    if query.strip():
        hits = await search_evidence(svc, scope, query, limit=limit, window=window)
        return [RecallHit(e, round(s, 6), list(m)) for e, s, m in hits]
    rows = await svc.run(ev_store.recent, svc.ch, scope, limit=limit, window=window)
    return [RecallHit(e, None, []) for e in rows]
