"""Routes of the memory plane. A token pinned to one user acts as that user (namespace
`@me` works); one pinned to a session also acts in that session only."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import BaseModel

from loom.api.deps import Caller, Svc, op_router
from loom.clock import utcnow
from loom.models import memory as m
from loom.models.errors import error_responses
from loom.ops.memory import context, extraction, facts, observe, profile, recall, unified, validity
from loom.ops.memory.facts import FactHit
from loom.store.memories import Fact

router = op_router("memory")


def _named(obj: object, model: type[BaseModel]) -> dict[str, Any]:
    """The attributes of `obj` that `model` answers, by name."""
    return {name: getattr(obj, name) for name in model.model_fields if hasattr(obj, name)}


def _fact(f: Fact) -> dict[str, object]:
    # No link is answered as null, not as the row's empty string.
    links = {"supersedes": f.supersedes or None, "superseded_by": f.superseded_by or None}
    return _named(f, m.FactOut) | links


def evidence_out(h: recall.RecallHit) -> m.EvidenceOut:
    """One evidence hit as answered (memory.recall, memory.ask)."""
    return m.EvidenceOut(**_named(h.evidence, m.EvidenceOut), score=h.score, matched=h.matched)


def fact_hit_out(h: FactHit) -> m.FactHitOut:
    """One fact hit as answered (memory.search, search, memory.ask)."""
    return m.FactHitOut(**_fact(h.fact), score=h.score, legs=h.legs, similarity=h.similarity, bm25=h.bm25)


def _extraction_response(out: extraction.Extraction) -> m.SetFromMessagesResponse:
    return m.SetFromMessagesResponse.model_validate(out, from_attributes=True)


@router.post("/memory.set", response_model=m.MemorySetResponse)
async def memory_set(body: m.MemorySetRequest, who: Caller, svc: Svc) -> m.MemorySetResponse:
    """Store facts for a user (optionally a session and run). A `key` names one chain: a
    different text supersedes its current fact (kept, closed). A fact that reads as high
    is refused (`high_sensitivity`, not stored); an embed failure stores the fact for BM25
    only (`embed_failed`)."""
    out = await facts.set_facts(svc, who, body)
    return m.MemorySetResponse(results=[m.SetResult.model_validate(o, from_attributes=True) for o in out])


@router.post("/memory.search", response_model=m.MemorySearchResponse)
async def memory_search(body: m.MemorySearchRequest, who: Caller, svc: Svc) -> m.MemorySearchResponse:
    """The user's current facts for `query` (or those valid at `as_of`, or in the window
    a time phrase of the query names): vector and BM25 legs fused by reciprocal rank,
    each hit with its score, legs, source, validity and links. Session briefs are never
    in it."""
    found = await facts.search(svc, who, body)
    hits = [fact_hit_out(h) for h in found.hits]
    window = m.FactWindowOut(**asdict(found.time_window)) if found.time_window else None
    return m.MemorySearchResponse(hits=hits, fallback_reason=found.fallback_reason, time_window=window)


@router.post("/memory.list", response_model=m.MemoryListResponse)
async def memory_list(body: m.MemoryListRequest, who: Caller, svc: Svc) -> m.MemoryListResponse:
    """Page through the user's current facts (or those valid at `as_of`), most recently
    updated first."""
    page = await facts.list_facts(svc, who, body)
    return m.MemoryListResponse(
        facts=[m.FactOut(**_fact(f)) for f in page.facts],
        next_cursor=page.next_cursor,
    )


@router.post("/memory.delete", response_model=m.MemoryDeleteResponse)
async def memory_delete(body: m.MemoryDeleteRequest, who: Caller, svc: Svc) -> m.MemoryDeleteResponse:
    """Forget facts, each with its whole chain (history included). Unknown or already
    forgotten ids are not an error."""
    out = await facts.delete_facts(svc, who, body.namespace, body.user_id, body.memory_ids)
    return m.MemoryDeleteResponse(deleted=out.deleted, forgotten=out.forgotten)


@router.post("/memory.history", response_model=m.MemoryHistoryResponse, responses=error_responses(404))
async def memory_history(body: m.MemoryHistoryRequest, who: Caller, svc: Svc) -> m.MemoryHistoryResponse:
    """One fact's chain, oldest to newest: each version's text, validity, source and the
    evidence it came from. A forgotten fact has none (404)."""
    chain = await validity.history(svc, who, body.namespace, body.user_id, body.memory_id)
    now = utcnow()
    return m.MemoryHistoryResponse(
        memory_id=body.memory_id,
        chain=[m.FactVersionOut(**_fact(f), current=validity.is_current(f, now)) for f in chain],
    )


@router.post("/memory.profile", response_model=m.MemoryProfileResponse)
async def memory_profile(body: m.MemoryProfileRequest, who: Caller, svc: Svc) -> m.MemoryProfileResponse:
    """The user's profile: a short summary in sections, built from their current facts
    (by the model, or from the facts alone: `basis`), rebuilt first when stale."""
    view = await profile.get_profile(svc, who, body.namespace, body.user_id)
    p = view.profile
    return m.MemoryProfileResponse(
        sections=[m.ProfileSectionOut(name=n, text=t) for n, t in p.sections],
        basis="llm" if p.basis == "llm" else "facts",
        reason=p.reason or None,
        fact_ids=p.fact_ids,
        dropped=p.dropped,
        built_at=p.built_at,
        rebuilt=view.rebuilt,
    )


@router.post("/memory.set_from_messages", response_model=m.SetFromMessagesResponse)
async def set_from_messages(
    body: m.SetFromMessagesRequest, who: Caller, svc: Svc
) -> m.SetFromMessagesResponse:
    """Store the messages as evidence (whether or not the namespace records
    conversations), then extract facts and decide add / update / delete / leave against
    the user's most similar facts. `defer: true` answers a job id and extracts on the
    worker pool. With no model configured the evidence is stored and no fact extracted."""
    out = await extraction.set_from_messages(svc, who, body)
    return _extraction_response(out)


@router.post("/memory.recall", response_model=m.RecallResponse)
async def memory_recall(body: m.RecallRequest, who: Caller, svc: Svc) -> m.RecallResponse:
    """BM25 (with `query`) and time-window (`since`, `until`) reads over the user's
    evidence: what extractions read, recorded or not. Never the transcript."""
    hits = await recall.recall(svc, who, body)
    return m.RecallResponse(hits=[evidence_out(h) for h in hits])


@router.post("/observe.record", response_model=m.ObserveRecordResponse)
async def observe_record(body: m.ObserveRecordRequest, who: Caller, svc: Svc) -> m.ObserveRecordResponse:
    """Keep an episodic observation of a tool action (run, tool, input summary, outcome)
    as evidence. It never becomes a fact by itself: see observe.crystallize."""
    eid = await observe.record(svc, who, body)
    return m.ObserveRecordResponse(evidence_id=eid)


@router.post("/observe.crystallize", response_model=m.SetFromMessagesResponse)
async def observe_crystallize(
    body: m.ObserveCrystallizeRequest, who: Caller, svc: Svc
) -> m.SetFromMessagesResponse:
    """Extract facts from a run's observations (source `crystallize`), with the same
    add / update / delete / leave decisions as memory.set_from_messages."""
    out = await observe.crystallize(svc, who, body)
    return _extraction_response(out)


@router.post("/context.pack", response_model=m.ContextPackResponse, responses=error_responses(404))
async def context_pack(body: m.ContextPackRequest, who: Caller, svc: Svc) -> m.ContextPackResponse:
    """What an agent needs to resume a (user, session/thread) scope within a token budget:
    the relevant facts, the transcript tail (when recorded), evidence hits, each labelled
    with its source. Deterministic, no LLM. A brief only when `brief_key` names one."""
    pack = await context.pack(svc, who, body)
    return m.ContextPackResponse.model_validate(pack, from_attributes=True)


@router.post("/search", response_model=m.UnifiedSearchResponse)
async def search(body: m.UnifiedSearchRequest, who: Caller, svc: Svc) -> m.UnifiedSearchResponse:
    """One query over the planes the caller may read, in sections: `memory` (the user's
    facts) and `conversation` (recorded turns; not for a token pinned to one user)."""
    u = await unified.search(svc, who, body)
    return m.UnifiedSearchResponse(
        memory=m.MemorySectionOut(
            hits=[fact_hit_out(h) for h in u.memory],
            note=u.memory_note,
        ),
        conversation=m.ConversationSectionOut(
            hits=[m.ConversationHitOut.model_validate(h, from_attributes=True) for h in u.conversation],
            note=u.conversation_note,
        ),
    )
