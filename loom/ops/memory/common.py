"""What every memory op shares: whose memory a call acts on (the scope), ids, limits."""

from __future__ import annotations

import hashlib
import uuid
from collections import OrderedDict

from loom.auth.principal import Principal
from loom.errors import Forbidden, InvalidRequest
from loom.models.memory import ScopedRequest
from loom.services import Services
from loom.store import evidence as ev_store
from loom.store.evidence import Evidence
from loom.store.memories import Scope

MAX_FACT_CHARS = 2_000
MAX_FACTS_PER_SET = 100
MAX_MESSAGES = 500
SIMILAR_PER_FACT = 5  # existing facts an extraction compares each new fact with


def scope_for(
    who: Principal, namespace: str, user_id: str | None, session_id: str = "", run_id: str = ""
) -> Scope:
    """The scope a call acts on. Memory is per user: a token pinned to one user acts as
    that user only (a body naming another is refused), one pinned to a session also acts
    in that session only; any other token names the user."""
    ns = who.namespace(namespace)
    if who.bounded:
        if user_id is not None and user_id != who.read_user_id:
            raise Forbidden(
                "this token acts for one user only; user_id must be that user or left out",
                field="user_id",
                rule="own_user",
            )
        user_id = who.read_user_id
        if who.read_scope == "own_session":
            if session_id and session_id != who.read_session_id:
                raise Forbidden(
                    "this token acts in one session only; session_id must be it or left out",
                    field="session_id",
                    rule="own_session",
                )
            session_id = who.read_session_id
    if not user_id:
        raise InvalidRequest("user_id is required (whose memory this is)", field="user_id", rule="required")
    return Scope(ns, user_id, session_id, run_id)


def scope_of(who: Principal, req: ScopedRequest) -> Scope:
    """The scope a request names (see scope_for)."""
    return scope_for(who, req.namespace, req.user_id, req.session_id, req.run_id)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def keyed_memory_id(scope: Scope, key: str) -> str:
    """A fact with a key has one id per (user, key), so setting the key again, even
    concurrently, revises the same row (the newest version wins)."""
    return "k" + _digest(scope.namespace, scope.user_id, key)


def new_memory_id() -> str:
    return "m" + uuid.uuid4().hex


def evidence_id(scope: Scope, source: str, msg_id: str) -> str:
    return "e" + _digest(scope.namespace, scope.user_id, scope.session_id, scope.run_id, source, msg_id)


def derive_msg_id(role: str, content: str) -> str:
    return "h" + _digest(role, content)[:24]


# -- scopes too large for one read (a per-process hint) -------------------------------------

LARGE_SCOPES_KEPT = 4096


class LargeScopes:
    """Scopes found above a one-read cap, remembered per process (the newest
    LARGE_SCOPES_KEPT) so their searches skip the read that would only find them large
    again. A hint only: both paths answer the same."""

    def __init__(self) -> None:
        self._seen: OrderedDict[Scope, None] = OrderedDict()

    def __contains__(self, scope: Scope) -> bool:
        return scope in self._seen

    def add(self, scope: Scope) -> None:
        self._seen[scope] = None
        while len(self._seen) > LARGE_SCOPES_KEPT:
            self._seen.popitem(last=False)


def large_scopes(svc: Services, kind: str) -> LargeScopes:
    """This process's hint for `kind` (facts | evidence)."""
    name = f"memory.large_scopes.{kind}"
    found = svc.extras.get(name)
    if found is None:
        found = svc.extras[name] = LargeScopes()
    assert isinstance(found, LargeScopes)
    return found


async def search_evidence(
    svc: Services,
    scope: Scope,
    query: str,
    *,
    limit: int,
    window: ev_store.Window = ev_store.EVER,
) -> list[tuple[Evidence, float, tuple[str, ...]]]:
    """BM25 over the scope's readable evidence (memory.recall, context.pack): one read of
    a small scope, else the postings."""
    large = large_scopes(svc, "evidence")
    if ev_store.SCAN_MAX_ROWS > 0 and scope not in large:
        found = await svc.run(
            ev_store.scan_search,
            svc.ch,
            scope,
            query,
            limit=limit,
            cap=ev_store.SCAN_MAX_ROWS,
            window=window,
        )
        if found is not None:
            return found
        large.add(scope)
    return await svc.run(ev_store.search, svc.ch, scope, query, limit=limit, window=window)
