"""The reads of saved messages (viewer): conversation.list_saved_messages,
conversation.saved_status and conversation.search_saved_messages.

All three act for one user (see :func:`loom.ops.conversation.saved.saving.acting_user`) in
the one namespace named, and answer from the transcript rows: the per-user indexes
(clickhouse_schema/003_saved.sql) propose rows, the transcript confirms each one is
still this user's, saved and live.

Search is hybrid. The vector leg ranks by cosine similarity of the query to each
message's embedding (built from its first 2,048 characters), at or above
LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY; the lexical leg ranks by BM25 over the whole
text (loom.store.bm25; more query terms held first, then BM25), so an exact term or a
phrase deep in a long message still ranks. Hybrid
fuses the two by reciprocal rank (k = 60), the lexical leg's share scaled by
`lexical_weight`; "semantic" and "lexical" run one leg. A query the embedder cannot
serve (it failed, or the query reads as high and is never sent) is answered by the
lexical leg alone, with `fallback_reason` saying why.

A saved message that reads as high (only an earlier build could save one) is never a
hit of either leg, whatever its stored flag says: each candidate's whole text is
checked again. The listing shows such a message with an empty excerpt, deciding on the
characters it shows and 1,024 past them, as conversation.threads does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loom.auth.principal import Principal, Role
from loom.errors import InvalidRequest
from loom.models.conversation.saved import ListSavedRequest, SearchSavedRequest
from loom.ops.conversation.common import as_utc, check_lexical_weight, decode_cursor, encode_cursor, rrf_score
from loom.ops.conversation.saved.saving import acting_user
from loom.ops.embedding import inline
from loom.sensitivity import reads_as_high, window_reads_as_high
from loom.services import Services
from loom.store import bm25
from loom.store import saved as saved_store
from loom.store.keys import TurnKey

HYBRID, SEMANTIC, LEXICAL = "hybrid", "semantic", "lexical"
SEARCH_MODES = (HYBRID, SEMANTIC, LEXICAL)
VECTOR_LEG, LEXICAL_LEG = "vector", "lexical"
QUERY_HIGH = "query_high_sensitivity"
EMBEDDER_UNAVAILABLE = "embedder_unavailable"


# -- list ------------------------------------------------------------------------------


@dataclass
class SavedItem:
    conversation_id: str
    message_id: str
    role: str
    ts: datetime  # when the user saved it (the message time where no save time was recorded)
    excerpt: str
    agent: str  # the agent whose copy it is (unsave names it)


@dataclass(kw_only=True)
class SavedPage:
    messages: list[SavedItem] = field(default_factory=list)
    next_cursor: str | None = None


async def list_saved_messages(svc: Services, who: Principal, ask: ListSavedRequest) -> SavedPage:
    """conversation.list_saved_messages (viewer): one user's saved messages, most
    recently saved first, in pages of `limit` (pass `next_cursor` back as `cursor`)."""
    who.require_role(Role.viewer)
    ns = who.namespace(ask.namespace)
    user = acting_user(who, ask.user_id)
    limit, conversation_id = ask.limit, ask.conversation_id
    expect = {"k": "saved", "n": ns, "u": user, "c": conversation_id}
    after = _position(decode_cursor(ask.cursor, expect=expect)) if ask.cursor else None
    entries = await svc.run(
        saved_store.saved_page, svc.ch, ns, user, limit=limit + 1, thread_id=conversation_id, after=after
    )
    more = len(entries) > limit
    entries = entries[:limit]
    shown = svc.settings.conversation_search_excerpt_chars
    keys = [TurnKey(ns, e.agent, e.thread_id, e.msg_id) for e in entries]
    found = await svc.run(saved_store.heads, svc.ch, ns, user, keys, shown + 1024)
    page = SavedPage()
    for key, e in zip(keys, entries, strict=True):
        head = found.get(key)
        if head is None:  # the index still had it; the transcript no longer does
            continue
        excerpt = "" if window_reads_as_high(head.head, shown) else head.head[:shown]
        page.messages.append(
            SavedItem(e.thread_id, e.msg_id, head.role, as_utc(head.saved_at or head.ts), excerpt, e.agent)
        )
    if more and entries:
        tail = entries[-1]
        page.next_cursor = encode_cursor(
            {**expect, "t": tail.sort_us, "th": tail.thread_id, "m": tail.msg_id, "a": tail.agent}
        )
    return page


def _position(payload: dict[str, Any]) -> tuple[int, str, str, str]:
    try:
        return int(payload["t"]), str(payload["th"]), str(payload["m"]), str(payload["a"])
    except (KeyError, TypeError, ValueError):
        raise InvalidRequest("cursor is not one this server issued", field="cursor", rule="opaque") from None


# -- status ----------------------------------------------------------------------------


async def saved_status(
    svc: Services,
    who: Principal,
    namespace: str,
    user_id: str | None,
    conversation_id: str,
    message_ids: Sequence[str],
) -> dict[str, bool]:
    """conversation.saved_status (viewer): which of `message_ids` (in one conversation)
    this user has saved."""
    who.require_role(Role.viewer)
    ns = who.namespace(namespace)
    user = acting_user(who, user_id)
    saved = await svc.run(saved_store.saved_ids, svc.ch, ns, user, conversation_id, list(message_ids))
    return {m: m in saved for m in message_ids}


# -- search ----------------------------------------------------------------------------


@dataclass
class SavedHit:
    conversation_id: str
    message_id: str
    role: str
    ts: datetime
    saved_at: datetime | None
    score: float
    excerpt: str
    legs: list[str]
    agent: str


@dataclass
class SavedSearch:
    search_mode: str  # the mode that answered (lexical when the vector leg fell back)
    hits: list[SavedHit]
    fallback_reason: str | None = None


@dataclass
class _Candidate:
    pair: saved_store.Pair
    similarity: float | None = None
    bm25: float | None = None
    matched: tuple[str, ...] = ()
    vector_rank: int | None = None
    lexical_rank: int | None = None


async def search_saved_messages(svc: Services, who: Principal, ask: SearchSavedRequest) -> SavedSearch:
    """conversation.search_saved_messages (viewer): this user's saved, live messages
    ranked for `query` (see the module's docstring)."""
    who.require_role(Role.viewer)
    ns = who.namespace(ask.namespace)
    user = acting_user(who, ask.user_id)
    query, limit, search_mode, lexical_weight = ask.query, ask.limit, ask.search_mode, ask.lexical_weight
    conversation_id = ask.conversation_id
    if search_mode not in SEARCH_MODES:
        raise InvalidRequest(
            f"search_mode must be one of {', '.join(SEARCH_MODES)}", field="search_mode", rule="one_of"
        )
    check_lexical_weight(lexical_weight)
    depth = max(50, limit * 3)  # candidates per leg: fusion needs more than the page

    def lexical() -> asyncio.Future[list[bm25.LexicalHit]]:
        return asyncio.ensure_future(
            svc.run(bm25.search, svc.ch, ns, user, query, limit=depth, thread_id=conversation_id)
        )

    mode: str = search_mode
    fallback = None
    lex_job = lexical() if mode in (HYBRID, LEXICAL) else None  # runs while the query is embedded
    vector_hits: list[saved_store.VectorHit] = []
    if mode in (HYBRID, SEMANTIC):
        vector_hits, fallback = await _vector_leg(svc, ns, user, query, depth, conversation_id)
        if fallback is not None:
            mode = LEXICAL
            lex_job = lex_job or lexical()
    lexical_hits = await lex_job if lex_job is not None else []
    candidates = list(_candidates(vector_hits, lexical_hits).values())
    ranked, verified = await _verified_top(svc, ns, user, candidates, mode, lexical_weight, limit)
    shown = svc.settings.conversation_search_excerpt_chars
    hits = [_hit(c, s, verified[c.pair], shown) for c, s in ranked]
    return SavedSearch(mode, hits, fallback)


VERIFY_MARGIN = 5  # candidates verified beyond the page, so a dropped one rarely costs a second read


async def _verified_top(
    svc: Services,
    ns: str,
    user: str,
    candidates: list[_Candidate],
    mode: str,
    lexical_weight: float,
    limit: int,
) -> tuple[list[tuple[_Candidate, float]], dict[saved_store.Pair, saved_store.Verified]]:
    """The page of hits, each confirmed by the transcript: saved by this user, live, and
    not reading as high (whatever its stored flag says). A candidate that fails is out
    of both legs, so the legs are ranked again without it; only the page (and a small
    margin) is read from the transcript, with the whole text of each message."""
    verified: dict[saved_store.Pair, saved_store.Verified] = {}
    dropped: set[saved_store.Pair] = set()
    while True:
        ranked = _fuse([c for c in candidates if c.pair not in dropped], mode, lexical_weight)
        if all(c.pair in verified for c, _ in ranked[:limit]):
            return ranked[:limit], verified
        todo = [c.pair for c, _ in ranked[: limit + VERIFY_MARGIN] if c.pair not in verified]
        found = await svc.run(saved_store.verify, svc.ch, ns, user, todo)
        for pair in todo:
            v = found.get(pair)
            if v is None or v.high_sensitivity or reads_as_high(v.content):
                dropped.add(pair)
            else:
                verified[pair] = v


async def _vector_leg(
    svc: Services, ns: str, user: str, query: str, depth: int, thread_id: str | None
) -> tuple[list[saved_store.VectorHit], str | None]:
    """The vector leg's hits, or why it could not run (the caller falls back to lexical)."""
    if reads_as_high(query):
        return [], QUERY_HIGH  # never sent to the embedder
    embedded = await inline.embed(svc, [query], query=True)
    if not embedded.ok or not embedded.vectors:
        return [], f"{EMBEDDER_UNAVAILABLE}: {embedded.error or 'no vector'}"[:500]
    hits = await svc.run(
        saved_store.vector_search,
        svc.ch,
        ns,
        user,
        embedded.vectors[0],
        embedded.model_id,
        limit=depth,
        min_similarity=svc.settings.conversation_search_min_similarity,
        thread_id=thread_id,
    )
    return hits, None


def _candidates(
    vector_hits: Sequence[saved_store.VectorHit], lexical_hits: Sequence[bm25.LexicalHit]
) -> dict[saved_store.Pair, _Candidate]:
    out: dict[saved_store.Pair, _Candidate] = {}
    for v in vector_hits:
        out.setdefault((v.thread_id, v.msg_id), _Candidate((v.thread_id, v.msg_id))).similarity = v.similarity
    for h in lexical_hits:
        c = out.setdefault((h.thread_id, h.msg_id), _Candidate((h.thread_id, h.msg_id)))
        c.bm25, c.matched = h.score, h.matched
    return out


def _fuse(kept: list[_Candidate], mode: str, lexical_weight: float) -> list[tuple[_Candidate, float]]:
    """Rank each leg among `kept`, score (see _score) and order: best first; on a tie, a
    hit of both legs, then the better rank."""
    by_vector = sorted(
        (c for c in kept if c.similarity is not None), key=lambda c: (-(c.similarity or 0.0), c.pair)
    )
    by_lexical = sorted(
        (c for c in kept if c.bm25 is not None),
        key=lambda c: (*bm25.rank_key(c.matched, c.bm25 or 0.0), c.pair),
    )
    for c in kept:
        c.vector_rank = c.lexical_rank = None
    for i, c in enumerate(by_vector, 1):
        c.vector_rank = i
    for i, c in enumerate(by_lexical, 1):
        c.lexical_rank = i
    scored = [(c, _score(c, mode, lexical_weight)) for c in kept]
    scored = [(c, s) for c, s in scored if s > 0]
    if mode == HYBRID:
        scored.sort(key=lambda cs: (-cs[1], -_legs_count(cs[0]), _best_rank(cs[0]), cs[0].pair))
    else:
        scored.sort(key=lambda cs: (_best_rank(cs[0]), cs[0].pair))  # the one leg's own order
    return scored


def _score(c: _Candidate, mode: str, lexical_weight: float) -> float:
    if mode == SEMANTIC:
        return c.similarity or 0.0
    if mode == LEXICAL:
        return c.bm25 or 0.0
    return rrf_score(c.vector_rank, c.lexical_rank, lexical_weight)


def _legs_count(c: _Candidate) -> int:
    return (c.vector_rank is not None) + (c.lexical_rank is not None)


def _best_rank(c: _Candidate) -> int:
    return min(r for r in (c.vector_rank, c.lexical_rank, 10**9) if r is not None)


def _hit(c: _Candidate, score: float, v: saved_store.Verified, shown: int) -> SavedHit:
    legs = [
        leg for leg, rank in ((VECTOR_LEG, c.vector_rank), (LEXICAL_LEG, c.lexical_rank)) if rank is not None
    ]
    excerpt = centred_excerpt(v.content, c.matched, shown) if c.matched else v.content[:shown]
    return SavedHit(
        c.pair[0],
        c.pair[1],
        v.role,
        as_utc(v.ts),
        as_utc(v.saved_at) if v.saved_at else None,
        round(score, 6),
        excerpt,
        legs,
        v.agent,
    )


# -- excerpts --------------------------------------------------------------------------

_ALNUM_BEFORE = r"(?<![^\W_])"
_ALNUM_AFTER = r"(?![^\W_])"


def _spans(content: str, terms: Sequence[str]) -> list[tuple[int, int, str]]:
    """Where the matched terms occur (whole tokens, any case), longest terms first so a
    compound ("inc-48213") is found as itself rather than as its parts."""
    alternatives = "|".join(re.escape(t) for t in sorted(set(terms), key=len, reverse=True))
    pattern = re.compile(f"{_ALNUM_BEFORE}(?:{alternatives}){_ALNUM_AFTER}", re.IGNORECASE)
    return [(m.start(), m.end(), m.group(0).lower()) for m in pattern.finditer(content)]


def centred_excerpt(content: str, terms: Sequence[str], chars: int) -> str:
    """`chars` characters of `content` centred on its densest cluster of the matched
    terms (most distinct terms, then most occurrences, then the earliest)."""
    if len(content) <= chars:
        return content
    spans = _spans(content, terms) if terms else []
    if not spans:
        return content[:chars]
    best: tuple[int, int, int] | None = None  # (-distinct, -occurrences, i)
    best_span = (spans[0][0], spans[0][1])
    j = 0
    for i in range(len(spans)):
        j = max(j, i)
        while j + 1 < len(spans) and spans[j + 1][1] - spans[i][0] <= chars:
            j += 1
        window = spans[i : j + 1]
        rank = (-len({s[2] for s in window}), -len(window), i)
        if best is None or rank < best:
            best, best_span = rank, (spans[i][0], window[-1][1])
    centre = (best_span[0] + best_span[1]) // 2
    start = max(0, min(centre - chars // 2, len(content) - chars))
    # Start on a word where that keeps the cluster in view.
    if start > 0:
        gap = content.find(" ", start, min(start + 24, best_span[0]))
        if gap != -1:
            start = gap + 1
    return content[start : start + chars]


__all__ = [
    "HYBRID",
    "LEXICAL",
    "SEARCH_MODES",
    "SEMANTIC",
    "SavedHit",
    "SavedItem",
    "SavedPage",
    "SavedSearch",
    "centred_excerpt",
    "list_saved_messages",
    "saved_status",
    "search_saved_messages",
]
