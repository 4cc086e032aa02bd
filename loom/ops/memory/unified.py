"""search (viewer): one query over the planes the caller may read, answered in
sections, the shape MCP's loom_search exposes.

- `memory`: the user's facts, ranked as memory.search ranks them. Memory is per user:
  the section runs when the call names `user_id` or the token is pinned to one user.
- `conversation`: conversation.search over the namespace's recorded turns. A token
  pinned to one user or session cannot read threads (a thread has no user axis), so
  for it the section is empty with `note: "not_permitted"`.

Session briefs are in neither section: they are never embedded or searched. The two
sections are read concurrently.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from loom.auth.principal import Principal, Role
from loom.errors import InvalidRequest
from loom.models.memory import UnifiedSearchRequest
from loom.ops.conversation.reading import searching
from loom.ops.conversation.reading.hits import Hit
from loom.ops.memory import facts as fact_ops
from loom.ops.memory.common import scope_for
from loom.services import Services


@dataclass
class Unified:
    memory: list[fact_ops.FactHit] = field(default_factory=list)
    memory_note: str | None = None
    conversation: list[Hit] = field(default_factory=list)
    conversation_note: str | None = None


async def search(svc: Services, who: Principal, req: UnifiedSearchRequest) -> Unified:
    who.require_role(Role.viewer)
    namespace, query, user_id, limit = req.namespace, req.query, req.user_id, req.limit
    if not query.strip():
        raise InvalidRequest("query must not be blank", field="query", rule="not_blank")
    out = Unified()
    # Scope and namespace are checked before either section reads anything.
    scope = scope_for(who, namespace, user_id) if user_id or who.bounded else None
    ns = who.namespace(namespace)

    async def memory() -> None:
        if scope is None:
            out.memory_note = "no_user"
            return
        found = await fact_ops.hybrid(svc, scope, query, limit=limit)
        out.memory, out.memory_note = found.hits, found.fallback_reason

    async def conversation() -> None:
        if who.bounded:
            out.conversation_note = "not_permitted"
            return
        result = await searching.search(svc, who, query, namespace=ns, limit=limit)
        out.conversation, out.conversation_note = result.hits, result.fallback_reason

    # The sections are independent reads: at once.
    await asyncio.gather(memory(), conversation())
    return out
