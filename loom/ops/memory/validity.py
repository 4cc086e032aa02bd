"""Facts that know time: validity, supersession and memory.history.

Every fact version carries `valid_from` (when it became true) and `valid_until` (when
it stopped; None while it holds). A change never overwrites a fact's text:

* **Supersession.** An update (an extraction's UPDATE decision, or memory.set on a key
  with a different text) writes a new fact with a new memory_id that `supersedes` the
  old one; the old one keeps its text, its validity closes where the new one's begins
  (never before its own start) and `superseded_by` names the new one. The successor's
  id derives from the old id (:func:`successor_id`), so two writers superseding the same
  fact at once write the same row (the newest version wins) and a chain never forks.
  Every fact of a chain shares its `lineage` (the first fact's id).
* **Closing.** An extraction's DELETE decision closes the fact's validity at the time of
  the evidence it came from (the newest message's time: now for a live conversation),
  keeping it in history.
* **Forgetting.** memory.delete (the user's explicit forget) tombstones the whole chain:
  a forgotten fact's history is forgotten too (loom.ops.memory.facts.delete_facts).

Times come from, in order: what memory.set was given; a time stated in the text with a
plain marker and an ISO date (``since 2026-03-01``, ``until 2026-06-30``: a bare date in
a fact names an event, not its validity, so it is not taken); the newest time of the
evidence an extraction decided from; else when the fact was set.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from loom.auth.principal import Principal, Role
from loom.errors import NotFound
from loom.ops.memory.common import _digest, scope_for
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import memories as store
from loom.store.memories import Fact, Scope

_ISO = r"(\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?)"
_FROM = re.compile(r"\b(?:since|as of|starting(?: on| from)?|effective(?: from)?|valid from)\s+" + _ISO, re.I)
_UNTIL = re.compile(r"\b(?:until|till|through|ending(?: on)?|valid until)\s+" + _ISO, re.I)


def _parse(raw: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def stated_times(text: str) -> tuple[datetime | None, datetime | None]:
    """The validity a fact's text states with a plain marker and an ISO date: (from,
    until); an until not after the from is not taken."""
    found_from = _FROM.search(text)
    found_until = _UNTIL.search(text)
    start = _parse(found_from.group(1)) if found_from else None
    end = _parse(found_until.group(1)) if found_until else None
    if start is not None and end is not None and end <= start:
        end = None
    return start, end


def times_for(
    text: str, given_from: datetime | None, given_until: datetime | None, default_from: datetime
) -> tuple[datetime, datetime | None]:
    """A new fact's validity: what the caller gave, else what its text states, else
    `default_from` (the evidence's time, or now) and open."""
    stated_from, stated_until = stated_times(text)
    start = given_from or stated_from or default_from
    end = given_until if given_until is not None else stated_until
    if end is not None and end <= start:
        end = None
    return start, end


# Whose a new fact is: a scope, or the fact it supersedes.
Owner = Scope | Fact


@dataclass(frozen=True, kw_only=True)
class Statement:
    """What a new fact version says, and what it was learnt from."""

    text: str
    kind: str = ""
    key: str = ""
    source: str
    evidence_ids: list[str]


def new_fact(
    owner: Owner, memory_id: str, said: Statement, now: datetime, valid: tuple[datetime, datetime | None]
) -> Fact:
    """A fact version made now (memory.set, an extraction's add or update): unlinked
    (:func:`link` chains it to the fact it supersedes) and not yet embedded."""
    return Fact(
        namespace=owner.namespace,
        user_id=owner.user_id,
        memory_id=memory_id,
        session_id=owner.session_id,
        run_id=owner.run_id,
        kind=said.kind,
        key=said.key,
        text=said.text,
        source=said.source,
        evidence_ids=said.evidence_ids,
        created_at=now,
        updated_at=now,
        valid_from=valid[0],
        valid_until=valid[1],
    )


def successor_id(namespace: str, user_id: str, old_id: str) -> str:
    """The id of the fact that supersedes `old_id` (derived: concurrent supersessions of
    one fact write one row)."""
    return old_id[:1] + _digest(namespace, user_id, "superseded", old_id)


def link(old: Fact, new: Fact, now: datetime) -> Fact:
    """`new` supersedes `old`: sets new's links, answers the old fact's closing version
    (same text, vector kept; its validity ends where new's begins, never before its own
    start, or earlier if it had already ended)."""
    new.supersedes, new.lineage = old.memory_id, old.lineage
    end = max(new.valid_from, old.valid_from)
    if old.valid_until is not None and old.valid_until < end:
        end = old.valid_until
    return dataclasses.replace(old, valid_until=end, superseded_by=new.memory_id, updated_at=now)


def close(old: Fact, at: datetime, now: datetime) -> Fact:
    """The version of `old` that stopped being true at `at` (never before its start)."""
    end = max(store.aware(at), old.valid_from)
    if old.valid_until is not None and old.valid_until < end:
        end = old.valid_until
    return dataclasses.replace(old, valid_until=end, updated_at=now)


def is_current(f: Fact, now: datetime) -> bool:
    return not f.tombstoned and not f.superseded_by and f.valid_at(now)


# -- memory.history ----------------------------------------------------------------------


def ordered(members: list[Fact]) -> list[Fact]:
    """A chain's facts oldest to newest: from the fact that supersedes none of them along
    `superseded_by`; anything not reached follows by time."""
    by_id = {f.memory_id: f for f in members}
    roots = sorted(
        (f for f in members if f.supersedes not in by_id),
        key=lambda f: (f.valid_from, f.created_at, f.memory_id),
    )
    out: list[Fact] = []
    seen: set[str] = set()
    for root in roots:
        f: Fact | None = root
        while f is not None and f.memory_id not in seen:
            seen.add(f.memory_id)
            out.append(f)
            f = by_id.get(f.superseded_by)
    rest = sorted((f for f in members if f.memory_id not in seen), key=lambda f: (f.valid_from, f.created_at))
    return out + rest


async def history(
    svc: Services, who: Principal, namespace: str, user_id: str | None, memory_id: str
) -> list[Fact]:
    """memory.history (viewer): the chain of the fact `memory_id` (any version of it),
    oldest to newest. A forgotten fact has no history (404)."""
    who.require_role(Role.viewer)
    scope = scope_for(who, namespace, user_id)
    found = await svc.run(store.chains, svc.ch, scope.namespace, scope.user_id, [memory_id])
    members = [
        f
        for f in found
        if not f.tombstoned and scope.admits(f.session_id, f.run_id) and not reads_as_high(f.text)
    ]
    if memory_id not in {f.memory_id for f in members}:
        raise NotFound("no such fact for this user (or it was forgotten)", field="memory_id", rule="exists")
    return ordered(members)
