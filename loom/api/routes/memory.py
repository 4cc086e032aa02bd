"""Routes of the memory plane. A token pinned to one user acts as that user (namespace
`@me` works); one pinned to a session also acts in that session only."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from loom.api.deps import require, services
from loom.api.models.errors import COMMON, error_responses
from loom.api.models.memory import (
    DecisionOut,
    EvidenceOut,
    FactHitOut,
    FactOut,
    MemoryDeleteRequest,
    MemoryDeleteResponse,
    MemoryListRequest,
    MemoryListResponse,
    MemorySearchRequest,
    MemorySearchResponse,
    MemorySetRequest,
    MemorySetResponse,
    RecallRequest,
    RecallResponse,
    SetFromMessagesRequest,
    SetFromMessagesResponse,
    SetResult,
)
from loom.auth.principal import Principal, Role
from loom.ops.memory import extraction, facts, recall
from loom.services import Services
from loom.store.memories import Fact

router = APIRouter(prefix="/v1", tags=["memory"], responses=error_responses(*COMMON))


def _fact(f: Fact) -> dict[str, object]:
    return {
        "memory_id": f.memory_id,
        "text": f.text,
        "kind": f.kind,
        "key": f.key,
        "session_id": f.session_id,
        "run_id": f.run_id,
        "source": f.source,
        "evidence_ids": f.evidence_ids,
        "created_at": f.created_at,
        "updated_at": f.updated_at,
    }


@router.post("/memory.set", response_model=MemorySetResponse)
async def memory_set(
    body: MemorySetRequest,
    who: Principal = Depends(require(Role.writer, bounded="any")),
    svc: Services = Depends(services),
) -> MemorySetResponse:
    """Store facts for a user (optionally a session and run). A `key` upserts. A fact that
    reads as high is refused (`high_sensitivity`, not stored); an embed failure stores the
    fact for BM25 only (`embed_failed`)."""
    out = await facts.set_facts(
        svc,
        who,
        body.namespace,
        body.user_id,
        [facts.NewFact(f.text, f.kind, f.key) for f in body.facts],
        session_id=body.session_id,
        run_id=body.run_id,
    )
    return MemorySetResponse(
        results=[
            SetResult(
                memory_id=o.memory_id, stored=o.stored, updated=o.updated, indexed=o.indexed, reason=o.reason
            )
            for o in out
        ]
    )  # type: ignore[arg-type]


@router.post("/memory.search", response_model=MemorySearchResponse)
async def memory_search(
    body: MemorySearchRequest,
    who: Principal = Depends(require(Role.viewer, bounded="any")),
    svc: Services = Depends(services),
) -> MemorySearchResponse:
    """The user's live facts for `query`: vector and BM25 legs fused by reciprocal rank,
    each hit with its score, legs, source and times. Session briefs are never in it."""
    found = await facts.search(
        svc,
        who,
        body.namespace,
        body.user_id,
        body.query,
        session_id=body.session_id,
        run_id=body.run_id,
        limit=body.limit,
    )
    hits = [
        FactHitOut(
            **_fact(h.fact),
            score=h.score,
            legs=h.legs,
            similarity=h.similarity,  # type: ignore[arg-type]
            bm25=h.bm25,
        )
        for h in found.hits
    ]
    return MemorySearchResponse(hits=hits, fallback_reason=found.fallback_reason)


@router.post("/memory.list", response_model=MemoryListResponse)
async def memory_list(
    body: MemoryListRequest,
    who: Principal = Depends(require(Role.writer, bounded="any")),
    svc: Services = Depends(services),
) -> MemoryListResponse:
    """Page through the user's live facts, most recently updated first."""
    page = await facts.list_facts(
        svc,
        who,
        body.namespace,
        body.user_id,
        session_id=body.session_id,
        run_id=body.run_id,
        kind=body.kind,
        limit=body.limit,
        cursor=body.cursor,
    )
    return MemoryListResponse(
        facts=[FactOut(**_fact(f)) for f in page.facts],  # type: ignore[arg-type]
        next_cursor=page.next_cursor,
    )


@router.post("/memory.delete", response_model=MemoryDeleteResponse)
async def memory_delete(
    body: MemoryDeleteRequest,
    who: Principal = Depends(require(Role.writer, bounded="any")),
    svc: Services = Depends(services),
) -> MemoryDeleteResponse:
    """Forget facts. Unknown or already forgotten ids are not an error."""
    return MemoryDeleteResponse(
        deleted=await facts.delete_facts(svc, who, body.namespace, body.user_id, body.memory_ids)
    )


@router.post("/memory.set_from_messages", response_model=SetFromMessagesResponse)
async def set_from_messages(
    body: SetFromMessagesRequest,
    who: Principal = Depends(require(Role.writer, bounded="any")),
    svc: Services = Depends(services),
) -> SetFromMessagesResponse:
    """Store the messages as evidence (whether or not the namespace records
    conversations), then extract facts and decide add / update / delete / leave against
    the user's most similar facts. `defer: true` answers a job id and extracts on the
    worker pool. With no model configured the evidence is stored and no fact extracted."""
    msgs = [extraction.Message(m.role, m.content, m.msg_id, m.ts) for m in body.messages]
    out = await extraction.set_from_messages(
        svc,
        who,
        body.namespace,
        body.user_id,
        msgs,
        session_id=body.session_id,
        run_id=body.run_id,
        defer=body.defer,
    )
    return SetFromMessagesResponse(
        evidence_ids=out.evidence_ids,
        extracted=out.extracted,
        decisions=[
            DecisionOut(action=d.action, memory_id=d.memory_id, text=d.text)  # type: ignore[arg-type]
            for d in out.decisions
        ],
        reason=out.reason,
        job_id=out.job_id,
        extraction_id=out.extraction_id,
    )  # type: ignore[arg-type]


@router.post("/memory.recall", response_model=RecallResponse)
async def memory_recall(
    body: RecallRequest,
    who: Principal = Depends(require(Role.viewer, bounded="any")),
    svc: Services = Depends(services),
) -> RecallResponse:
    """BM25 (with `query`) and time-window (`since`, `until`) reads over the user's
    evidence: what extractions read, recorded or not. Never the transcript."""
    hits = await recall.recall(
        svc,
        who,
        body.namespace,
        body.user_id,
        query=body.query,
        session_id=body.session_id,
        run_id=body.run_id,
        since=body.since,
        until=body.until,
        limit=body.limit,
    )
    return RecallResponse(
        hits=[
            EvidenceOut(
                evidence_id=h.evidence.evidence_id,
                msg_id=h.evidence.msg_id,
                role=h.evidence.role,
                content=h.evidence.content,
                source=h.evidence.source,  # type: ignore[arg-type]
                session_id=h.evidence.session_id,
                run_id=h.evidence.run_id,
                ts=h.evidence.ts,
                score=h.score,
                matched=h.matched,
            )
            for h in hits
        ]
    )
