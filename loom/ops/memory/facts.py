"""memory.set, memory.search, memory.list and memory.delete: the facts of a user.

A fact is stored only from these ops and from extraction (never from a recorded turn).
A fact whose text reads as high is refused (`high_sensitivity`) and never stored or
embedded. Facts are embedded in the API process (a handful of short texts: a round
trip through the worker pool would cost more than the model call), fail-open: a failed
embed stores the fact with the error on its row, out of the vector leg, still found by
BM25.

memory.search is hybrid: exact cosine over the scope's live embedded facts, and BM25 over
their whole text (per-query statistics), fused by reciprocal rank (k=60). A scope of at
most SCAN_MAX_FACTS live facts (the usual user) is read whole in one round trip that runs
while the query is embedded, and both legs are ranked from that read in this process
(loom.store.memory_scan): the search costs one query and waits for no read after the
embedding, and none at all while this process's read of the scope is current
(loom.ops.memory.scan_cache). A larger scope is ranked from this process's index of it
(loom.ops.memory.large_scope: both legs exact, here, then the hits' rows read and
checked) while one is current; otherwise by the server, one round trip per leg run
concurrently (BM25 over the postings while the query is embedded, exact cosine after),
and the index is read in the background.
Each hit says which legs found it, its source (set / extraction / crystallize, with the
evidence ids an extraction decided from) and its times. A time phrase of the query
("in May 2025", "since March") bounds the facts' validity (loom.ops.memory.time_window). Session briefs live in their
own table and are never embedded: they cannot be a hit.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import InvalidRequest
from loom.models.memory import MemoryListRequest, MemorySearchRequest, MemorySetRequest
from loom.ops.conversation.common import decode_cursor, encode_cursor
from loom.ops.embedding import inline
from loom.ops.memory import erasing, large_scope, scan_cache, time_window, validity
from loom.ops.memory.common import (
    MAX_FACT_CHARS,
    keyed_memory_id,
    large_scopes,
    new_memory_id,
    scope_for,
    scope_of,
)
from loom.ops.memory.time_window import FactWindow
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import memories as store
from loom.store import memory_index, memory_scan
from loom.store import profiles as profile_store
from loom.store.memories import Fact, Scope

RRF_K = 60
SET, EXTRACTION, CRYSTALLIZE = "set", "extraction", "crystallize"


@dataclass
class NewFact:
    text: str
    kind: str = ""
    key: str = ""
    valid_from: datetime | None = None
    valid_until: datetime | None = None


@dataclass
class SetOutcome:
    memory_id: str | None
    stored: bool
    updated: bool = False  # a key that already named a live fact
    indexed: bool = False  # in the vector leg
    reason: str | None = None  # high_sensitivity | embed_failed | subject_erased
    supersedes: str | None = None  # the key's fact this one replaced (a different text)


async def embed_into(svc: Services, facts: list[Fact]) -> None:
    """Give each fact its vector, or the error that kept it from one (fail-open). The
    texts were screened: none reads as high."""
    if not facts:
        return
    result = await inline.embed(svc, [f.text for f in facts])
    for i, f in enumerate(facts):
        if result.ok and result.vectors is not None:
            f.embedding, f.model, f.embed_error = [float(x) for x in result.vectors[i]], result.model_id, ""
        else:
            f.embedding, f.model, f.embed_error = [], "", result.error or "internal_error: no vector"


def _check(facts: list[NewFact]) -> None:
    for i, f in enumerate(facts):
        if not f.text.strip():
            raise InvalidRequest(
                "a fact's text must not be blank", field=f"facts[{i}].text", rule="not_blank"
            )
        if len(f.text) > MAX_FACT_CHARS:
            raise InvalidRequest(
                f"a fact holds at most {MAX_FACT_CHARS} characters",
                field=f"facts[{i}].text",
                rule="max_length",
            )
        if f.valid_from and f.valid_until and f.valid_until <= f.valid_from:
            raise InvalidRequest(
                "valid_until must be later than valid_from",
                field=f"facts[{i}].valid_until",
                rule="after_valid_from",
            )


async def set_facts(svc: Services, who: Principal, req: MemorySetRequest) -> list[SetOutcome]:
    """memory.set (writer): store facts for the scope. A key names one chain of facts:
    setting it with the same text revises its current fact in place, with a different
    text supersedes it (loom.ops.memory.validity)."""
    who.require_role(Role.writer)
    scope = scope_of(who, req)
    facts = [NewFact(f.text, f.kind, f.key, f.valid_from, f.valid_until) for f in req.facts]
    _check(facts)
    outcomes: list[SetOutcome] = []
    rows: list[Fact] = []  # new and revised facts (embedded)
    closed: list[Fact] = []  # superseded facts' closing versions (text and vector kept)
    writes = erasing.Writes(scope.namespace, scope.user_id)
    heads = await svc.run(
        store.heads, svc.ch, scope.namespace, scope.user_id, sorted({f.key for f in facts if f.key})
    )
    now = utcnow()
    for f in facts:
        if reads_as_high(f.text):
            outcomes.append(SetOutcome(None, False, reason="high_sensitivity"))
            continue
        head = heads.get(f.key) if f.key else None
        start, end = validity.times_for(f.text, f.valid_from, f.valid_until, now)
        if head is not None and head.text == f.text and head.valid_until is None:
            # The same statement again: the current fact is revised in place.
            row = dataclasses.replace(
                head,
                session_id=scope.session_id,
                run_id=scope.run_id,
                kind=f.kind,
                source=SET,
                evidence_ids=[],
                updated_at=now,
                valid_from=f.valid_from or head.valid_from,
                valid_until=f.valid_until,
            )
            outcomes.append(SetOutcome(row.memory_id, True, updated=True))
        else:
            mid = keyed_memory_id(scope, f.key) if f.key else new_memory_id()
            if head is not None:
                mid = validity.successor_id(scope.namespace, scope.user_id, head.memory_id)
            said = validity.Statement(text=f.text, kind=f.kind, key=f.key, source=SET, evidence_ids=[])
            row = validity.new_fact(scope, mid, said, now, (start, end))
            if head is not None:
                old = validity.link(head, row, now)
                if any(r is head for r in rows):  # set earlier in this call: close it there
                    head.valid_until, head.superseded_by = old.valid_until, old.superseded_by
                else:
                    closed.append(old)
            outcomes.append(
                SetOutcome(mid, True, updated=head is not None, supersedes=head.memory_id if head else None)
            )
        rows.append(row)
        if f.key:
            heads[f.key] = row
    await embed_into(svc, rows)
    for r in [*rows, *closed]:
        r.version = next_version()
    await svc.run(store.insert, svc.ch, [*rows, *closed])
    writes.add_facts([*rows, *closed])
    if await erasing.settle(svc, writes):
        return [SetOutcome(None, False, reason=erasing.ERASED if o.stored else o.reason) for o in outcomes]
    if rows:
        await profile_changed(svc, scope)
    by_id = {r.memory_id: r for r in rows}
    for o in outcomes:
        if o.memory_id is not None:
            row = by_id[o.memory_id]
            o.indexed = bool(row.embedding)
            o.reason = None if o.indexed else "embed_failed"
    return outcomes


async def profile_changed(svc: Services, scope: Scope) -> None:
    """The user's facts changed: the profile is stale (a mark with no text) until the
    next read or extraction rebuilds it (loom.ops.memory.profile)."""
    await svc.run(profile_store.mark_stale, svc.ch, scope.namespace, scope.user_id)


# -- search ------------------------------------------------------------------------------


@dataclass
class FactHit:
    fact: Fact
    score: float
    legs: list[str]
    similarity: float | None = None
    bm25: float | None = None


@dataclass
class FactSearch:
    hits: list[FactHit] = field(default_factory=list)
    fallback_reason: str | None = None
    time_window: FactWindow | None = None  # what the query's time phrase did


# A scope of at most this many live facts is searched by one read of all of them, sent
# while the query is embedded (loom.store.memory_scan); a larger one by the two
# server-side legs. 0 turns the one-read path off. Measured (bench/results/2026-12-03-memory-quiet.txt,
# same-run ratios): at 100 facts a user the one read took search to 0.56 of the legs'
# median; at 1,000 it was no faster for search and slower for context.pack (the API
# parsing 1,000 rows and their vectors), so the cap sits between.
SCAN_MAX_FACTS = 400


async def hybrid(
    svc: Services, scope: Scope, query: str, *, limit: int, as_of: datetime | None = None
) -> FactSearch:
    """The scope's current facts (or those valid at `as_of`) ranked for `query` (no role
    check: callers have done it).

    Both legs read the newest live versions and answer their facts whole. A scope of
    at most SCAN_MAX_FACTS live facts is read once, while the query is embedded, and
    both legs are ranked from that read; a larger one is ranked by the server: BM25
    starts while the query is embedded, the vector leg as soon as the vector is there."""
    depth = max(50, limit * 3)
    large = large_scopes(svc, "facts")  # scopes found above the cap: the server ranks
    if SCAN_MAX_FACTS <= 0 or scope in large:
        if SCAN_MAX_FACTS > 0 and as_of is None:
            indexed = await _from_index(svc, scope, query, limit=limit, depth=depth)
            if indexed is not None:
                return indexed
        lex_job = asyncio.ensure_future(svc.run(store.bm25, svc.ch, scope, query, limit=depth, as_of=as_of))
        try:
            emb, fallback = await _query_vector(svc, query)
            vec = await _vector_leg(svc, scope, emb, depth, as_of)
        finally:
            lex = await lex_job
        return FactSearch(_fuse(vec, lex, scope, limit), fallback)
    scan_job = asyncio.ensure_future(scan_cache.scan(svc, scope, query, cap=SCAN_MAX_FACTS, as_of=as_of))
    try:
        emb, fallback = await _query_vector(svc, query)
    finally:
        found = await scan_job
    if found is None:  # too large for one read: the server ranks (the vector is ready)
        large.add(scope)
        if as_of is None:
            large_scope.start_fill(svc, scope)  # the next searches rank from its index
        lex_job = asyncio.ensure_future(svc.run(store.bm25, svc.ch, scope, query, limit=depth, as_of=as_of))
        try:
            vec = await _vector_leg(svc, scope, emb, depth, as_of)
        finally:
            lex = await lex_job
        return FactSearch(_fuse(vec, lex, scope, limit), fallback)
    lex = memory_scan.lexical(found, limit=depth)
    vec = []
    if emb is not None and emb.vectors:
        vec = memory_scan.vector(
            found,
            emb.vectors[0],
            emb.model_id,
            limit=depth,
            min_similarity=svc.settings.conversation_search_min_similarity,
        )
    return FactSearch(_fuse(vec, lex, scope, limit), fallback)


async def _from_index(
    svc: Services, scope: Scope, query: str, *, limit: int, depth: int
) -> FactSearch | None:
    """A large scope ranked from this process's index of it (loom.ops.memory.large_scope),
    or None when there is no current one (the server then ranks). BM25 is ranked while
    the query is embedded, cosine after; then only the hits' rows are read and checked."""
    index = await large_scope.current(svc, scope)
    if index is None:
        return None
    at_ms = int(utcnow().timestamp() * 1000)
    lex_job = asyncio.ensure_future(svc.run(memory_index.lexical, index, query, at_ms=at_ms, limit=depth))
    try:
        emb, fallback = await _query_vector(svc, query)
    finally:
        lex = await lex_job
    vec: list[memory_index.Ranked] = []
    if emb is not None and emb.vectors:
        vec = await svc.run(
            memory_index.vector,
            index,
            emb.vectors[0],
            emb.model_id,
            at_ms=at_ms,
            limit=depth,
            min_similarity=svc.settings.conversation_search_min_similarity,
        )
    fused = _rrf([(v.memory_id, v.score) for v in vec], [(x.memory_id, x.score) for x in lex])
    found = await large_scope.rows(svc, scope, fused, limit=limit)
    return FactSearch(
        [FactHit(f, round(h.score, 6), h.legs, h.similarity, h.bm25) for h, f in found], fallback
    )


async def _vector_leg(
    svc: Services,
    scope: Scope,
    emb: inline.InlineResult | None,
    depth: int,
    as_of: datetime | None = None,
) -> list[store.VectorHit]:
    """The server-side vector leg (exact cosine in ClickHouse), if there is a vector."""
    if emb is None or not emb.vectors:
        return []
    return await svc.run(
        store.vector_search,
        svc.ch,
        scope,
        emb.vectors[0],
        emb.model_id,
        limit=depth,
        min_similarity=svc.settings.conversation_search_min_similarity,
        as_of=as_of,
    )


async def _query_vector(svc: Services, query: str) -> tuple[inline.InlineResult | None, str | None]:
    """The query's embedding, or why there is none (the search then ranks by BM25 alone)."""
    if reads_as_high(query):
        return None, "query_high_sensitivity"  # never sent to the embedder
    emb = await inline.embed(svc, [query], query=True)
    if emb.ok and emb.vectors:
        return emb, None
    return None, f"embedder_unavailable: {emb.error or 'no vector'}"[:500]


def _rrf(vec: list[tuple[str, float]], lex: list[tuple[str, float]]) -> list[large_scope.Fused]:
    """Reciprocal rank fusion of the two legs' (id, score) lists, best first (ties: more
    legs, then id)."""
    fused: dict[str, large_scope.Fused] = {}
    for rank, (mid, sim) in enumerate(vec, 1):
        h = fused.setdefault(mid, large_scope.Fused(mid, 0.0, [], None, None))
        h.score += 1.0 / (RRF_K + rank)
        h.legs.append("vector")
        h.similarity = round(sim, 6)
    for rank, (mid, score) in enumerate(lex, 1):
        h = fused.setdefault(mid, large_scope.Fused(mid, 0.0, [], None, None))
        h.score += 1.0 / (RRF_K + rank)
        h.legs.append("lexical")
        h.bm25 = round(score, 6)
    return sorted(fused.values(), key=lambda h: (-h.score, -len(h.legs), h.memory_id))


def _fuse(vec: list[store.VectorHit], lex: list[store.LexicalHit], scope: Scope, limit: int) -> list[FactHit]:
    """Reciprocal rank fusion of the two legs, best `limit` first."""
    rows = {v.memory_id: v.fact for v in vec} | {lh.id: lh.row for lh in lex}
    hits: list[FactHit] = []
    for h in _rrf([(v.memory_id, v.similarity) for v in vec], [(lh.id, lh.score) for lh in lex]):
        f = rows[h.memory_id]
        # Both legs read the newest live version; the screen stays as a second guard.
        if f.tombstoned or reads_as_high(f.text) or not scope.admits(f.session_id, f.run_id):
            continue
        hits.append(FactHit(f, round(h.score, 6), h.legs, h.similarity, h.bm25))
        if len(hits) == limit:
            break
    return hits


async def search(svc: Services, who: Principal, req: MemorySearchRequest) -> FactSearch:
    """memory.search (viewer): current facts, or those valid at `as_of`; with no
    `as_of`, a time phrase of the query bounds them (loom.ops.memory.time_window)."""
    who.require_role(Role.viewer)
    scope = scope_of(who, req)
    query, limit, as_of, time_phrases = req.query, req.limit, req.as_of, req.time_phrases
    if not query.strip():
        raise InvalidRequest("query must not be blank", field="query", rule="not_blank")
    time_window.check(time_phrases)
    window = None
    if as_of is None and time_phrases == time_window.TIME_FILTER:
        window = time_window.of(query, utcnow())
    if window is None:
        return await hybrid(svc, scope, query, limit=limit, as_of=as_of)
    return await _in_window(svc, scope, query, limit, window)


async def _in_window(svc: Services, scope: Scope, query: str, limit: int, window: FactWindow) -> FactSearch:
    """The search bounded by the query's time window; without it when it holds no fact."""
    found = await hybrid(svc, scope, query, limit=time_window.pool(limit, window), as_of=window.as_of)
    found.hits = [h for h in found.hits if time_window.keeps(window, h.fact.valid_from)][:limit]
    if not found.hits:  # nothing held then: the question may not have meant a window
        found = await hybrid(svc, scope, query, limit=limit)
        window = dataclasses.replace(window, applied=False)
    found.time_window = window
    return found


# -- list and delete --------------------------------------------------------------------


@dataclass
class FactPage:
    facts: list[Fact]
    next_cursor: str | None


async def list_facts(svc: Services, who: Principal, req: MemoryListRequest) -> FactPage:
    """memory.list: the scope's current facts (or those valid at `as_of`), most recently
    updated first."""
    who.require_role(Role.writer)
    scope = scope_of(who, req)
    at = "" if req.as_of is None else req.as_of.isoformat()
    expect = {"u": scope.user_id, "s": scope.session_id, "r": scope.run_id, "k": req.kind or "", "a": at}
    after = None
    if req.cursor:
        payload = decode_cursor(req.cursor, expect=expect)
        after = (int(payload["ms"]), str(payload["id"]))
    rows = await svc.run(
        store.page, svc.ch, scope, limit=req.limit + 1, after=after, kind=req.kind, as_of=req.as_of
    )
    nxt = None
    if len(rows) > req.limit:
        rows = rows[: req.limit]
        last = rows[-1]
        nxt = encode_cursor({**expect, "ms": int(last.updated_at.timestamp() * 1000), "id": last.memory_id})
    return FactPage(rows, nxt)


@dataclass
class Forgotten:
    deleted: list[str]  # the named ids that were live
    forgotten: list[str]  # every version forgotten with them (their chains)


async def delete_facts(
    svc: Services, who: Principal, namespace: str, user_id: str | None, memory_ids: list[str]
) -> Forgotten:
    """memory.delete (writer): forget facts, each with its whole chain (the versions it
    superseded and that superseded it: forgetting forgets history too), a tombstone
    version each; the decisions that recorded their texts keep none. An unknown or
    already forgotten id is not an error."""
    who.require_role(Role.writer)
    scope = scope_for(who, namespace, user_id)
    found = await svc.run(store.chains, svc.ch, scope.namespace, scope.user_id, memory_ids)
    gone = await tombstone(svc, [f for f in found if not f.tombstoned])
    if gone:
        await svc.run(store.blank_decisions, svc.ch, scope.namespace, scope.user_id, gone)
        await profile_changed(svc, scope)
    named = set(memory_ids)
    return Forgotten([m for m in gone if m in named], gone)


async def tombstone(svc: Services, live: list[Fact]) -> list[str]:
    """A tombstone version of each live fact (it keeps no text and no vector: a forgotten
    fact is not readable even in the place of its old versions)."""
    now = utcnow()
    for f in live:
        f.tombstoned, f.text, f.updated_at, f.embedding, f.model = True, "", now, [], ""
        f.version = next_version()
    await svc.run(store.insert, svc.ch, live)
    for namespace, user_id in {(f.namespace, f.user_id) for f in live}:
        await scan_cache.changed(svc, namespace, user_id)
    return [f.memory_id for f in live]
