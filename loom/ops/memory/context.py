"""context.pack (viewer): everything an agent needs to resume a (user, session/thread)
scope, within a token budget, deterministic and with no LLM at read time.

Sections, filled in this order until the budget is spent (a section's items are taken
best first; an item that does not fit is skipped, a smaller later one may still fit):

1. `brief`: only when the request names `brief_key` (briefs never load on their own).
1b. `profile`: only when the request asks (`include_profile`): the user's profile, a
   section an item; the stored one when fresh, else built from the current facts alone
   (no model call at read time; loom.ops.memory.profile).
2. `facts`: with a `query`, the user's facts ranked as memory.search ranks them;
   without one, the most recently updated. A pack for a session holds the user's
   durable facts (set with no session) and the session's own, never another
   session's; a token pinned to one session keeps to that session's facts.
3. `transcript`: the tail of `thread_id` (the agent's copy) when the namespace records
   conversations; turns that read as high are left out. A token bound to one user or
   session gets none (note `bounded_token`): a thread mixes users, and an end-user
   token never reads another user's words or a turn no user owns.
4. `evidence`: with a `query`, memory.recall's BM25 hits; without one, the newest.

Every item names its source (a memory_id, msg_id or evidence_id) and time. Tokens are
estimated as ceil(characters / 4). The sections are read concurrently (the query's
embedding, the facts' two legs, the transcript and the evidence each one round trip),
then the budget is spent in the order above.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from datetime import datetime

from loom.auth.principal import Principal, Role
from loom.models.memory import ContextPackRequest
from loom.models.session import BriefGetRequest
from loom.ops.briefs import ops as brief_ops
from loom.ops.memory import facts as fact_ops
from loom.ops.memory import profile as profile_ops
from loom.ops.memory.common import scope_for, search_evidence
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import evidence as ev_store
from loom.store import memories as store
from loom.store import namespaces as ns_store
from loom.store.profiles import Profile

TAIL_TURNS = 40
FACTS = 30
EVIDENCE = 10


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


@dataclass
class Item:
    text: str
    source: str  # memory:<id> | turn:<msg_id> | evidence:<id> | brief:<key> | profile:<section>
    ts: datetime | None = None


@dataclass
class Section:
    name: str
    items: list[Item] = field(default_factory=list)
    tokens: int = 0
    note: str | None = None  # why a section is empty (e.g. not_recorded)


@dataclass
class Pack:
    sections: list[Section]
    token_budget: int
    tokens_used: int


class _Budget:
    def __init__(self, total: int) -> None:
        self.left = total

    def take(self, section: Section, item: Item) -> None:
        cost = tokens(item.text)
        if cost <= self.left:
            self.left -= cost
            section.tokens += cost
            section.items.append(item)


async def pack(svc: Services, who: Principal, req: ContextPackRequest) -> Pack:
    who.require_role(Role.viewer)
    scope = scope_for(who, req.namespace, req.user_id, req.session_id)
    if scope.session_id and who.read_scope != "own_session":
        scope = replace(scope, with_user_facts=True)
    budget = _Budget(req.token_budget)
    sections: list[Section] = []
    profile_job = (
        asyncio.ensure_future(_profile(svc, scope, session_pinned=who.read_scope == "own_session"))
        if req.include_profile
        else None
    )
    if req.brief_key:
        try:
            view = await brief_ops.brief_get(
                svc, who, BriefGetRequest(namespace=scope.namespace, brief_key=req.brief_key)
            )
        except BaseException:
            if profile_job is not None:
                profile_job.cancel()
            raise
        s = Section("brief")
        budget.take(s, Item(view.text, f"brief:{view.brief_key}", view.updated_at))
        sections.append(s)
    if profile_job is not None:
        p = await profile_job
        s = Section("profile")
        for name, text in p.sections:
            budget.take(s, Item(f"{name}: {text}", f"profile:{name}", p.built_at))
        if not p.sections:
            s.note = "empty"
        sections.append(s)
    # The sections' reads are independent: they run at once; the budget is then spent
    # in the sections' order, so the answer is the same as reading them one by one.
    facts, transcript, evidence = await asyncio.gather(
        _facts(svc, scope, req.query),
        _transcript(svc, who, scope, req.thread_id, req.agent),
        _evidence(svc, scope, req.query),
    )
    for section, items in (facts, transcript, evidence):
        if section.name == "transcript":
            _take_tail(budget, section, items)
        else:
            for item in items:
                budget.take(section, item)
        sections.append(section)
    return Pack(sections, req.token_budget, req.token_budget - budget.left)


async def _profile(svc: Services, scope: store.Scope, *, session_pinned: bool) -> Profile:
    if session_pinned:
        return profile_ops.screened(await profile_ops.for_session(svc, scope))
    return await profile_ops.current(svc, scope)


async def _facts(svc: Services, scope: store.Scope, query: str) -> tuple[Section, list[Item]]:
    if query.strip():
        found = [h.fact for h in (await fact_ops.hybrid(svc, scope, query, limit=FACTS)).hits]
    else:
        found = await svc.run(store.page, svc.ch, scope, limit=FACTS)
    return Section("facts"), [Item(f.text, f"memory:{f.memory_id}", f.updated_at) for f in found]


async def _transcript(
    svc: Services, who: Principal, scope: store.Scope, thread_id: str, agent: str
) -> tuple[Section, list[Item]]:
    """The thread's newest readable turns, newest first."""
    s = Section("transcript")
    if who.bounded:
        s.note = "bounded_token"
        return s, []
    if not thread_id:
        s.note = "no_thread"
        return s, []
    recorded = await svc.run(ns_store.recording, svc.ch, [scope.namespace])
    if scope.namespace not in recorded:
        s.note = "not_recorded"
        return s, []
    turns = await svc.run(
        conv_store.page, svc.ch, scope.namespace, agent, thread_id, limit=TAIL_TURNS, descending=True
    )
    items: list[Item] = []
    for m in turns:
        if m.high_sensitivity or reads_as_high(m.content) or m.role not in ("user", "assistant", "system"):
            continue
        items.append(Item(f"{m.role}: {m.content}", f"turn:{m.msg_id}", m.ts))
    return s, items


def _take_tail(budget: _Budget, s: Section, newest_first: list[Item]) -> None:
    """The budget keeps the latest turns; they are shown in thread order."""
    kept: list[Item] = []
    for item in newest_first:
        before = len(s.items)
        budget.take(s, item)
        if len(s.items) > before:
            kept.append(s.items.pop())
    s.items = list(reversed(kept))


async def _evidence(svc: Services, scope: store.Scope, query: str) -> tuple[Section, list[Item]]:
    if query.strip():
        rows = [e for e, _, _ in await search_evidence(svc, scope, query, limit=EVIDENCE)]
    else:
        rows = await svc.run(ev_store.recent, svc.ch, scope, limit=EVIDENCE)
    return Section("evidence"), [
        Item(f"{e.role}: {e.content}", f"evidence:{e.evidence_id}", e.ts) for e in rows
    ]
