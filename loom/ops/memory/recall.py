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
from datetime import datetime

from loom.auth.principal import Principal, Role
from loom.errors import ConflictingFields
from loom.ops.memory.common import scope_for, search_evidence
from loom.services import Services
from loom.store import evidence as ev_store
from loom.store.evidence import Evidence


@dataclass
class RecallHit:
    evidence: Evidence
    score: float | None
    matched: list[str]


async def recall(
    svc: Services,
    who: Principal,
    namespace: str,
    user_id: str | None,
    *,
    query: str = "",
    session_id: str = "",
    run_id: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 10,
) -> list[RecallHit]:
    who.require_role(Role.viewer)
    scope = scope_for(who, namespace, user_id, session_id, run_id)
    if since is not None and until is not None and since >= until:
        raise ConflictingFields("since must be before until", fields=["since", "until"], rule="window")
    if query.strip():
        hits = await search_evidence(svc, scope, query, limit=limit, since=since, until=until)
        return [RecallHit(e, round(s, 6), list(m)) for e, s, m in hits]
    rows = await svc.run(ev_store.recent, svc.ch, scope, limit=limit, since=since, until=until)
    return [RecallHit(e, None, []) for e in rows]
