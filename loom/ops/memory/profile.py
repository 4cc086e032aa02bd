"""memory.profile (viewer): a short, sectioned, living summary of one user.

One profile per (namespace, user), kept in loom.memory_profiles and built from the
user's current facts (never from evidence or the transcript):

* **With a model** (prompts/profile.txt) it has up to five sections: identity,
  preferences, work, relationships, other (:data:`SECTIONS`), each at most
  :data:`SECTION_CHARS` characters; `basis: "llm"`.
* **Without one** (the stock fake LLM), or when the model fails or answers no JSON, it
  is built from the facts alone: one section per fact kind (`general` for facts with
  none), the newest facts first, whole facts up to :data:`SECTION_CHARS` characters;
  `basis: "facts"` with `reason` `llm_not_configured` or `llm_failed`.

When it is rebuilt: an extraction (inline or the deferred `memory_extract` job) that
added, updated or closed a fact rebuilds it at once. memory.set and memory.delete only
write a stale mark (one small insert, no text: a forgotten fact leaves nothing in the
newest version); the next memory.profile rebuilds a stale profile before answering (so
it reflects a fact just set), and context.pack, which never calls a model at read time,
builds a stale profile from the facts alone without storing it. A rebuild's version is
stamped before it reads the facts, so a change made while it ran leaves it stale.

Privacy: facts that read as high are never stored, and a section the model writes that
reads as high is dropped (counted in `dropped`), never stored or answered; the answer
screens every section again.

A token pinned to one session sees a profile of that session's facts, built from the
facts alone and not stored (the stored profile spans the user's sessions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loom import failures
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.ops.memory import erasing
from loom.ops.memory.common import scope_for
from loom.providers.llm import ChatMessage, LLMError, json_object
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import memories as store
from loom.store import profiles as profile_store
from loom.store.memories import Fact, Scope
from loom.store.profiles import Profile

log = loom_logging.get("loom.memory.profile")
SECTIONS = ("identity", "preferences", "work", "relationships", "other")
SECTION_CHARS = 600
MAX_SECTIONS = 8  # of a profile built from the facts (one per kind)
MAX_FACTS = 200  # the newest current facts a profile is built from
MAX_PROMPT_CHARS = 16_000


@dataclass(kw_only=True)
class ProfileView:
    profile: Profile
    rebuilt: bool  # built for this answer (it was stale or missing)


def from_facts(namespace: str, user_id: str, facts: list[Fact], reason: str) -> Profile:
    """The profile built deterministically: one section per kind, newest facts first."""
    groups: dict[str, list[str]] = {}
    for f in sorted(facts, key=lambda f: (f.updated_at, f.memory_id), reverse=True):
        if not reads_as_high(f.text):
            groups.setdefault(f.kind or "general", []).append(f.text)
    names, texts = [], []
    for kind in sorted(groups, key=lambda k: (k == "general", k))[:MAX_SECTIONS]:
        kept: list[str] = []
        size = 0
        for text in groups[kind]:
            if size + len(text) + 2 > SECTION_CHARS and kept:
                break
            kept.append(text[:SECTION_CHARS])
            size += len(text) + 2
        names.append(kind)
        texts.append("; ".join(kept))
    return Profile(
        namespace=namespace,
        user_id=user_id,
        section_names=names,
        section_texts=texts,
        basis="facts",
        reason=reason,
        fact_ids=[f.memory_id for f in facts],
    )


async def _from_llm(svc: Services, namespace: str, user_id: str, facts: list[Fact]) -> Profile:
    listing, size = [], 0
    for f in sorted(facts, key=lambda f: (f.valid_from, f.memory_id), reverse=True):
        item = {"text": f.text, "kind": f.kind, "since": f.valid_from.isoformat()}
        size += len(f.text) + 60
        if size > MAX_PROMPT_CHARS:
            break
        listing.append(item)
    reply = await svc.llm.complete(
        [
            ChatMessage("system", (Path(__file__).parent / "prompts" / "profile.txt").read_text()),
            ChatMessage("user", json.dumps({"facts": listing}, ensure_ascii=False)),
        ],
        temperature=0.0,
    )
    raw = json_object(reply).get("sections", {})
    if not isinstance(raw, dict):
        raise ValueError("sections is not an object")
    names, texts, dropped = [], [], 0
    for name in SECTIONS:
        text = raw.get(name)
        text = str(text).strip()[:SECTION_CHARS] if isinstance(text, (str, int, float)) else ""
        if not text:
            continue
        if reads_as_high(text):
            dropped += 1  # never stored, never answered
            continue
        names.append(name)
        texts.append(text)
    return Profile(
        namespace=namespace,
        user_id=user_id,
        section_names=names,
        section_texts=texts,
        basis="llm",
        fact_ids=[f.memory_id for f in facts],
        dropped=dropped,
    )


async def build(svc: Services, namespace: str, user_id: str, facts: list[Fact]) -> Profile:
    """The profile of these facts: the model's when one is configured and answers, else
    the facts' own."""
    readable = [f for f in facts if not reads_as_high(f.text)]
    if not readable:
        return from_facts(namespace, user_id, [], "no_facts")
    if not svc.llm.configured:
        return from_facts(namespace, user_id, readable, "llm_not_configured")
    try:
        return await _from_llm(svc, namespace, user_id, readable)
    except (LLMError, ValueError) as exc:
        log.warning("memory profile failed", error=failures.detail(exc))
        return from_facts(namespace, user_id, readable, "llm_failed")


async def rebuild(svc: Services, scope: Scope, writes: erasing.Writes) -> Profile:
    """Build the user's profile from their current facts and store it (its version
    stamped before the facts are read). The caller settles `writes` (an erasure that
    outlived the rebuild removes it)."""
    version = next_version()
    user = Scope(scope.namespace, scope.user_id)
    facts = await svc.run(store.page, svc.ch, user, limit=MAX_FACTS)
    built = await build(svc, scope.namespace, scope.user_id, facts)
    built.version, built.built_at = version, utcnow()
    await svc.run(profile_store.put, svc.ch, built)
    writes.profiles.append(version)
    return built


def screened(p: Profile) -> Profile:
    """The profile without any section that reads as high (a second guard)."""
    keep = [(n, t) for n, t in p.sections if not reads_as_high(n) and not reads_as_high(t)]
    p.section_names, p.section_texts = [n for n, _ in keep], [t for _, t in keep]
    return p


async def for_session(svc: Services, scope: Scope) -> Profile:
    """A session's profile (a token pinned to it): from its facts alone, not stored."""
    facts = await svc.run(store.page, svc.ch, scope, limit=MAX_FACTS)
    return from_facts(scope.namespace, scope.user_id, facts, "session_scope")


async def current(svc: Services, scope: Scope) -> Profile:
    """context.pack's profile, with no model call: the stored one when fresh, else built
    from the current facts alone (not stored)."""
    stored = await svc.run(profile_store.get, svc.ch, scope.namespace, scope.user_id)
    if stored is not None and not stored.stale:
        return screened(stored)
    facts = await svc.run(store.page, svc.ch, Scope(scope.namespace, scope.user_id), limit=MAX_FACTS)
    return from_facts(scope.namespace, scope.user_id, facts, "stale" if stored else "not_built")


async def get_profile(svc: Services, who: Principal, namespace: str, user_id: str | None) -> ProfileView:
    """memory.profile (viewer): the stored profile, rebuilt first when stale or missing."""
    who.require_role(Role.viewer)
    scope = scope_for(who, namespace, user_id)
    if scope.session_id:
        return ProfileView(profile=screened(await for_session(svc, scope)), rebuilt=True)
    stored = await svc.run(profile_store.get, svc.ch, scope.namespace, scope.user_id)
    if stored is not None and not stored.stale:
        return ProfileView(profile=screened(stored), rebuilt=False)
    writes = erasing.Writes(scope.namespace, scope.user_id)
    built = await rebuild(svc, scope, writes)
    if await erasing.settle(svc, writes):
        built = from_facts(scope.namespace, scope.user_id, [], erasing.ERASED)
    return ProfileView(profile=screened(built), rebuilt=True)
