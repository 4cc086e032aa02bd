"""conversation.search (viewer): vector search over the embedded turns of the caller's
namespaces, with a substring fallback.

Rules (reading, searching and the sensitivity rules):

* Turns are ranked by cosine similarity to the query's embedding; a hit below
  LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY is dropped.
* Which namespaces: a body naming ``namespace`` searches that one (``namespace_scope``
  left out, or ``"one"``); one naming none fans out over every namespace the token
  grants (``"all_mine"``, the default). ``"all_mine"`` with a ``namespace`` contradicts
  itself and is refused (422 naming both fields), as is ``"one"`` without one. The
  answer lists the namespaces searched.
* A hit shows the first LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS characters of its turn
  (both settings are read on every call).
* When the query cannot be embedded (the embedder fails or times out) the op still
  answers, by a case-insensitive substring match over the same turns, and says so
  (``mode="substring"``, ``fallback_reason``). A query that itself reads as high is
  never sent to the embedder: it is answered the same way (``query_high_sensitivity``)
  and its text is never logged.
* A turn that reads as high (marked ``high_sensitivity``, or whose shown characters and
  1,024 past them read as high) is never returned. Tombstoned turns and embedding rows,
  failed embeds, and superseded vectors never are either: a candidate is checked
  against the newest versions of its embedding row and transcript row unless nothing
  can have changed it since its vector row was written (loom.store.search_marks: no
  save, unsave, re-embed, deletion or compaction in its thread or namespace since, no
  retention TTL due); such a row holds everything a hit shows.
* Only recorded turns are searched. A row stored by conversation.save_message alone
  (origin "saved", migration 007) belongs to the user who saved it: its vector never
  reaches the vector tables (their feeds take recorded rows only), verification drops
  a candidate whose transcript copy is not recorded, and the substring fallback reads
  recorded rows only.

Modes (``search_mode``; docs/search.md has the figures behind them):

* ``vector`` (the default): the rules above.
* ``lexical``: BM25 over the whole text of every recorded turn in scope
  (loom.store.transcript_terms: postings kept by ClickHouse, migration 016; the query's
  stop-words dropped, terms stemmed). No similarity floor: a turn holding the query's
  words is a hit. Each candidate is checked against its newest transcript row (live,
  recorded, not high, the very text its postings came from) and screened as a vector
  hit is; a high turn has no postings at all.
* ``hybrid``: both legs, fused by reciprocal rank (k = 60), the lexical leg's share
  the lexical leg's share ``lexical_weight`` (0 to 1, loom.limits; the vector leg takes
  the rest), as conversation.search_saved_messages fuses them. The floor applies to the vector leg only: a vector candidate under it is not
  in that leg, while a lexical hit enters without it (a question's exact words may sit
  in a turn the embedding ranks far away). The vector leg contributes its best
  ``limit`` verified hits (the search vector mode runs), the lexical leg its best
  ``limit + 10``.

A hit says which legs found it (``legs``) and its ``score`` (similarity in vector mode,
BM25 in lexical mode, the fused score in hybrid mode); ``similarity`` is the cosine
similarity wherever the vector leg found the turn, else null. In hybrid and lexical
modes a query that cannot be embedded (the embedder failed, or the query reads as high
and is never sent) is answered by the lexical leg alone (``mode="lexical"``,
``fallback_reason`` says why): the lexical leg never leaves ClickHouse.

Where the vectors are ranked: by the read index (loom.read_index, one process per
machine holding them in memory, exact; loom.ops.conversation.reading.index_search) when one runs,
which says of each candidate whether it may be answered as held; the others are verified
as below. When it does not answer, is behind, or does not hold a namespace, the engine
ranks them (those namespaces), and ``fallback_reason`` says why.

How the engine ranks the vectors (measured in bench/results/2026-12-01-1014-search.txt; see loom/store/search.py):
a namespace whose filtered rows number at most LOOM_CONVERSATION_SEARCH_EXACT_MAX_ROWS
is scanned exactly (a thread, a run or a small namespace: cheap, and exact); larger ones
go through the HNSW index. Candidates are over-fetched, verified, and fetched again
(more of them) when verification dropped too many; an index search that still comes up
short after that is redone exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final, Literal, Protocol, cast

import numpy as np

from loom import failures, query_time
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import ConflictingFields, InvalidRequest
from loom.limits import DEFAULT_LEXICAL_WEIGHT, MAX_QUERY_CHARS
from loom.limits import MAX_SEARCH_LIMIT as MAX_LIMIT
from loom.ops.conversation.common import (
    EMBED_CHARS,
    LEGACY_EMBED_CHARS,
    as_utc,
    check_lexical_weight,
    rrf_score,
)
from loom.ops.conversation.reading import index_search, search_rerank
from loom.ops.conversation.reading.hits import Hit
from loom.ops.conversation.reading.index_search import INDEX_MISSING, INDEX_PLAN
from loom.ops.embedding import inline
from loom.read_index import client as read_index_client
from loom.read_index.client import IndexClient
from loom.read_index.figures import FALLBACKS
from loom.sensitivity import reads_as_high, window_reads_as_high
from loom.services import Services, Slot
from loom.store import search as store
from loom.store import search_marks
from loom.store import transcript_terms as lexical_store
from loom.store.keys import EmbKey, TurnKey
from loom.store.search import Candidate, Filters

log = loom_logging.get("loom.conversation.search")

SCOPES = ("all_mine", "one")
TIME_FILTER = "filter"  # time_phrases: a time phrase of the query bounds the turns' time
TIME_PHRASES = (TIME_FILTER, "ignore")
SCREEN_PAST = 1_024  # characters past the excerpt that must not read as high either

VECTOR: Final = "vector"
SUBSTRING: Final = "substring"
HYBRID: Final = "hybrid"
LEXICAL: Final = "lexical"
SEARCH_MODES = (VECTOR, HYBRID, LEXICAL)
LEG_DEPTH = 10  # the lexical leg of a hybrid search contributes its best limit + LEG_DEPTH hits
# fallback_reason values
QUERY_HIGH = "query_high_sensitivity"
EMBEDDER_TIMEOUT = "embedder_timeout"
EMBEDDER_ERROR = "embedder_error"

# Strategies, reported for tests and the benchmark (the response header x-loom-search-plan).
LEXICAL_PLAN = "lexical"
EXACT = "exact"
INDEX = "index"
UNINDEXED = "exact_unindexed"

_LAST_DIM: Slot[int] = Slot("conversation.search.last_dim")  # the dimension of the last query's vector
# Recent planner counts (see _count), by (table, namespaces, filters, model): when counted, and the counts.
_PLAN_COUNTS: Slot[dict[tuple[str, tuple[str, ...], Filters, str], tuple[float, Counted]]] = Slot(
    "conversation.search.plan_counts"
)
_PLAN_COUNTS_MAX = 10_000
PLAN_TTL_S = 10.0

VERIFY_SPARE = 3  # candidates verified beyond `limit` in the first lookup
RETRIES = 3  # re-fetches (4x more each time) before an index search is redone exactly
GROWTH = 4


Mode = Literal["vector", "hybrid", "lexical", "substring"]


@dataclass(kw_only=True)
class SearchResult:
    mode: Mode
    fallback_reason: str | None
    namespaces: list[str]
    hits: list[Hit]
    plan: list[str] = field(default_factory=list)  # strategies used, e.g. ["index"] or ["exact", "index"]
    model: str | None = None  # the model whose vectors answered (None: no vector leg ran)
    time_window: TimeFilter | None = None  # the query's time phrase, and whether it bounded the hits
    rerank: str | None = None  # asked to re-rank: "reranked", or why the hits kept their order


@dataclass(frozen=True)
class TimeFilter:
    """A time phrase of the query (loom.query_time) and what it did: `applied` False
    when the window held no hit, and the search answered without it."""

    phrase: str
    since: datetime | None
    until: datetime | None
    applied: bool


@dataclass(frozen=True)
class _Ask:
    """One search's fixed terms (settings read once, at the start of the call)."""

    namespaces: tuple[str, ...]
    filters: Filters
    limit: int
    floor: float
    shown: int
    model: str = ""  # the query vector's model: only vectors of this model are compared with it

    @property
    def window(self) -> int:
        return self.shown + SCREEN_PAST

    def probe(self, namespaces: Sequence[str], vector: np.ndarray) -> store.Probe:
        return store.Probe(namespaces, vector, self.filters, self.model)

    @property
    def first_fetch(self) -> int:
        # Room for a few stale, dead or screened rows without a second round trip.
        return min(store.MAX_FETCH, self.limit * 2 + 10)

    def answer(
        self,
        mode: Mode,
        hits: list[Hit],
        plan: list[str],
        fallback: str | None = None,
        *,
        vectors: bool = True,
    ) -> SearchResult:
        """The answer over this search's namespaces; `vectors`: a vector leg ran, so the
        answer names the model whose vectors it compared."""
        return SearchResult(
            mode=mode,
            fallback_reason=fallback,
            namespaces=list(self.namespaces),
            hits=hits,
            plan=plan,
            model=self.model if vectors else None,
        )


# A retention TTL may remove a turn this long before its due time by our clock (skew).
TTL_MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class _Trust:
    """Which candidates may be answered from their vector row alone: written after the
    last change to their thread (the marks of loom.store.search_marks, read after the
    candidates), not due to the retention TTL, and the only version of their turn
    among the candidates."""

    expires_before: datetime | None = None  # turns older than this may be gone (TTL)

    def covers(self, c: Candidate, marks: dict[search_marks.Pair, int], repeated: set[EmbKey]) -> bool:
        if c.trusted is not None:  # the read index's own judgement of the marks
            return c.trusted and c.key not in repeated and self.unexpired(c)
        mark = marks.get((c.namespace, c.thread_id))
        return (
            mark is not None
            and c.model != ""  # a row older than its model column: its embedding row names the model
            and 0 <= mark < c.version
            and c.key not in repeated
            and self.unexpired(c)
        )

    def unexpired(self, c: Candidate) -> bool:
        return self.expires_before is None or as_utc(c.ts) > self.expires_before


def _trust(svc: Services) -> _Trust:
    days = svc.settings.retention_conversations_days
    return _Trust(utcnow() - timedelta(days=days) + TTL_MARGIN if days > 0 else None)


async def _read_marks(svc: Services, pairs: set[search_marks.Pair]) -> dict[search_marks.Pair, int]:
    """The threads' marks; none (verify everything) when Redis does not answer."""
    try:
        return await search_marks.read(svc.redis, svc.ch, svc.run, sorted(pairs))
    except Exception as exc:  # noqa: BLE001 - search still answers, only slower
        log.warning(
            "conversation.search: search marks unreadable, verifying every candidate",
            error=failures.detail(exc),
        )
        return {}


def resolve_namespaces(who: Principal, scope: str | None, namespace: str | None) -> tuple[str, ...]:
    """The namespaces to search; `scope` None (not given) follows from `namespace`."""
    if scope is None:
        scope = "all_mine" if namespace is None else "one"
    if scope not in SCOPES:
        raise InvalidRequest(
            f"namespace_scope must be one of {', '.join(SCOPES)}", field="namespace_scope", rule="one_of"
        )
    if scope == "one":
        if not namespace:
            raise InvalidRequest(
                'namespace is required with namespace_scope "one"',
                field="namespace",
                rule="required_with_scope_one",
            )
        return (who.namespace(namespace),)
    if namespace is not None:
        raise ConflictingFields(
            'namespace_scope "all_mine" searches every namespace the token grants and takes '
            'no namespace: drop namespace, or drop namespace_scope (or set it to "one") to '
            "search only that namespace",
            fields=["namespace_scope", "namespace"],
            rule="namespace_with_all_mine",
        )
    return tuple(dict.fromkeys(who.namespaces))


def _check(
    query: str, limit: int, search_mode: str = VECTOR, lexical_weight: float = DEFAULT_LEXICAL_WEIGHT
) -> None:
    if not query or len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(
            f"query must hold 1 to {MAX_QUERY_CHARS:,} characters", field="query", rule="length"
        )
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", field="limit", rule="range")
    if search_mode not in SEARCH_MODES:
        raise InvalidRequest(
            f"search_mode must be one of {', '.join(SEARCH_MODES)}", field="search_mode", rule="one_of"
        )
    check_lexical_weight(lexical_weight)


async def search(
    svc: Services,
    who: Principal,
    query: str,
    *,
    namespace_scope: str | None = None,
    namespace: str | None = None,
    limit: int = 10,
    filters: Filters | None = None,
    search_mode: str = VECTOR,
    lexical_weight: float = DEFAULT_LEXICAL_WEIGHT,
    time_phrases: str = TIME_FILTER,
    rerank: bool = False,
) -> SearchResult:
    """conversation.search (viewer); `rerank`: the configured LLM orders a deeper pool
    of hits (loom.ops.conversation.search_rerank), the page is cut from its order."""
    if not rerank:
        return await _search(
            svc,
            who,
            query,
            namespace_scope,
            namespace,
            limit,
            filters,
            search_mode,
            lexical_weight,
            time_phrases,
        )
    _check(query, limit, search_mode, lexical_weight)
    pool = max(limit, search_rerank.RERANK_DEPTH)
    result = await _search(
        svc, who, query, namespace_scope, namespace, pool, filters, search_mode, lexical_weight, time_phrases
    )
    hits, result.rerank = await search_rerank.rerank(svc, query, result.hits)
    result.hits = hits[:limit]
    return result


async def _search(
    svc: Services,
    who: Principal,
    query: str,
    namespace_scope: str | None,
    namespace: str | None,
    limit: int,
    filters: Filters | None,
    search_mode: str,
    lexical_weight: float,
    time_phrases: str,
) -> SearchResult:
    who.require_role(Role.viewer)
    namespaces = resolve_namespaces(who, namespace_scope, namespace)
    _check(query, limit, search_mode, lexical_weight)
    if time_phrases not in TIME_PHRASES:
        raise InvalidRequest(
            f"time_phrases must be one of {', '.join(TIME_PHRASES)}", field="time_phrases", rule="one_of"
        )
    if not namespaces:
        return SearchResult(mode=cast(Mode, search_mode), fallback_reason=None, namespaces=[], hits=[])
    s = svc.settings
    ask = _Ask(
        namespaces,
        filters or Filters(),
        limit,
        s.conversation_search_min_similarity,
        s.conversation_search_excerpt_chars,
        _current_model(svc),
    )
    window = await _time_window(svc, ask, query) if time_phrases == TIME_FILTER else None
    if window is None:
        return await _answer(svc, ask, query, search_mode, lexical_weight)
    bounded = replace(ask, filters=replace(ask.filters, since=window.since, until=window.until))
    result = await _answer(svc, bounded, query, search_mode, lexical_weight)
    applied = bool(result.hits)
    if not applied:  # nothing said in that window: the question may not have meant one
        result = await _answer(svc, ask, query, search_mode, lexical_weight)
    result.time_window = TimeFilter(window.phrase, window.since, window.until, applied)
    return result


async def _time_window(svc: Services, ask: _Ask, query: str) -> query_time.TimeWindow | None:
    """The query's time window (loom.query_time), its anchor ("before the move")
    resolved to the time of the anchor words' best lexical hit in the same scope."""
    window = query_time.window(query, utcnow())
    if window is None or not window.anchor:
        return window
    found = await _lexical(svc, replace(ask, limit=1), window.anchor)
    if not found:
        return None
    at = found[0].ts
    if window.anchor_side == "before":
        return replace(window, until=at)
    return replace(window, since=at + timedelta(microseconds=1))  # after it: the anchor turn itself is not


async def _answer(
    svc: Services, ask: _Ask, query: str, search_mode: str, lexical_weight: float
) -> SearchResult:
    """The search in its mode, with the fallbacks of the module docstring."""
    if search_mode != VECTOR:
        return await _by_words(svc, ask, query, search_mode, lexical_weight)
    if reads_as_high(query):
        return await _by_substring(svc, ask, query, QUERY_HIGH)
    # The planner's row counts do not need the vector: read them while the query is embedded.
    counting = _count_ahead(svc, ask)
    embedded = await inline.embed(svc, [query], query=True)
    if not embedded.ok or not embedded.vectors:
        await _discard(counting)
        reason = (
            EMBEDDER_TIMEOUT
            if failures.code_of(embedded.error) == failures.EMBEDDER_TIMEOUT
            else EMBEDDER_ERROR
        )
        log.warning("conversation.search fell back to substring", reason=reason)
        return await _by_substring(svc, ask, query, reason)
    return await _by_vector(
        svc, replace(ask, model=embedded.model_id), embedded.vectors[0], counting, _trust(svc)
    )


def _current_model(svc: Services) -> str:
    """The model id of this process's embedder, for the planner's counts read while the
    query is embedded (the embedded query's own model id decides what is compared)."""
    try:
        return inline.current(svc).model_id
    except Exception:  # noqa: BLE001 - a misconfigured embedder fails the embed, which falls back
        return ""


Counted = tuple[dict[str, int], int]


@dataclass
class _Counting:
    table: str
    task: asyncio.Future[Counted]


def _count_ahead(svc: Services, ask: _Ask) -> _Counting | None:
    """Start counting in the vector table of the dimension the last query had."""
    table = store.VECTOR_TABLES.get(_LAST_DIM.get(svc) or 0)
    if table is None:
        return None
    return _Counting(table, asyncio.ensure_future(_count(svc, table, ask)))


async def _count(svc: Services, table: str, ask: _Ask) -> Counted:
    """The planner's counts, reused for PLAN_TTL_S. They only choose a strategy and its
    fetch size, and both strategies return the same hits (an index search short of hits
    fetches again, then scans), so a stale count costs speed, never a hit. A namespace
    counted empty is not searched at all, so that count is never reused: its first
    turns must be found at once."""
    cache = _PLAN_COUNTS.made(svc, dict)
    key = (table, ask.namespaces, ask.filters, ask.model)
    now = time.monotonic()
    got = cache.get(key)
    if (
        got is not None
        and now - got[0] < PLAN_TTL_S
        and all(got[1][0].get(ns, 0) > 0 for ns in ask.namespaces)
    ):
        return got[1]
    counted = await svc.run(store.counts, svc.ch, table, ask.namespaces, ask.filters, ask.model)
    if len(cache) >= _PLAN_COUNTS_MAX:
        cache.clear()
    cache[key] = (now, counted)
    return counted


async def _discard(counting: _Counting | None) -> None:
    if counting is not None:
        with contextlib.suppress(Exception):
            await counting.task


async def _counts(svc: Services, ask: _Ask, table: str, counting: _Counting | None) -> Counted:
    if counting is not None and counting.table == table:
        return await counting.task
    await _discard(counting)
    return await _count(svc, table, ask)


# -- vector mode --------------------------------------------------------------------

Fetch = Callable[[int, int], Awaitable[list[Candidate]]]  # (fetch, attempt) -> candidates, best first


async def _by_vector(
    svc: Services, ask: _Ask, raw: np.ndarray, counting: _Counting | None, trust: _Trust
) -> SearchResult:
    vector = np.asarray(raw, dtype=np.float32)
    client = read_index_client.of(svc)
    if client is None:
        return await _by_engine(svc, ask, vector, counting, trust)
    got = await index_search.fetch(client, ask.namespaces, vector, ask.filters, ask.model, ask.first_fetch)
    if isinstance(got, str):
        FALLBACKS.labels(got).inc()
        found = await _by_engine(svc, ask, vector, counting, trust)
        return replace(found, fallback_reason=got)
    await _discard(counting)
    held = tuple(ns for ns in ask.namespaces if ns not in got.missing)
    hits, plan = (
        await _from_index(svc, replace(ask, namespaces=held), client, vector, trust, got),
        [INDEX_PLAN],
    )
    if not got.missing:
        return ask.answer(VECTOR, hits, plan)
    FALLBACKS.labels(INDEX_MISSING).inc()
    rest = await _by_engine(svc, replace(ask, namespaces=tuple(got.missing)), vector, None, trust)
    return ask.answer(VECTOR, _best(hits + rest.hits, ask.limit), plan + rest.plan, INDEX_MISSING)


async def _from_index(
    svc: Services,
    ask: _Ask,
    client: IndexClient,
    vector: np.ndarray,
    trust: _Trust,
    first: index_search.Fetched,
) -> list[Hit]:
    """The index's candidates, verified where it cannot vouch for them, fetched again
    (more) while verification left too few: an exact ranking, so fewer candidates than
    asked means none is left."""

    async def fetch(n: int, attempt: int) -> list[Candidate]:
        if attempt == 0:
            return first.candidates
        got = await index_search.fetch(client, ask.namespaces, vector, ask.filters, ask.model, n)
        return got.candidates if isinstance(got, index_search.Fetched) else []

    hits, _ = await _collect(svc, ask, fetch, trust, cap=None)
    return hits


async def _by_engine(
    svc: Services, ask: _Ask, vector: np.ndarray, counting: _Counting | None, trust: _Trust
) -> SearchResult:
    _LAST_DIM.put(svc, int(vector.shape[0]))
    table = store.VECTOR_TABLES.get(int(vector.shape[0]))
    if table is None:
        await _discard(counting)
        hits = await _unindexed(svc, ask, vector, trust)
        return ask.answer(VECTOR, hits, [UNINDEXED])
    per_ns, total = await _counts(svc, ask, table, counting)
    small, large = _split(ask.namespaces, per_ns, svc.settings.conversation_search_exact_max_rows)
    jobs: list[Awaitable[list[Hit]]] = []
    plan: list[str] = []
    if small:
        jobs.append(_exact(svc, ask, table, small, vector, trust))
        plan.append(EXACT)
    if large:
        matched = sum(per_ns[ns] for ns in large)
        jobs.append(_indexed(svc, ask, table, large, vector, trust, share=matched / max(1, total)))
        plan.append(INDEX)
    found = [h for group in await asyncio.gather(*jobs) for h in group]
    return ask.answer(VECTOR, _best(found, ask.limit), plan)


def _split(
    namespaces: Sequence[str], per_ns: dict[str, int], exact_max_rows: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Namespaces to scan exactly (few rows after the filters) and to search by index;
    a namespace with no matching row is not searched at all."""
    small = tuple(ns for ns in namespaces if 0 < per_ns.get(ns, 0) <= exact_max_rows)
    large = tuple(ns for ns in namespaces if per_ns.get(ns, 0) > exact_max_rows)
    return small, large


def _best(hits: list[Hit], limit: int) -> list[Hit]:
    hits.sort(key=lambda h: (-(h.similarity or 0.0), h.namespace, h.thread_id, h.msg_id))
    return hits[:limit]


async def _exact(
    svc: Services, ask: _Ask, table: str, namespaces: tuple[str, ...], vector: np.ndarray, trust: _Trust
) -> list[Hit]:
    async def fetch(n: int, attempt: int) -> list[Candidate]:
        return await svc.run(store.exact, svc.ch, table, ask.probe(namespaces, vector), n)

    hits, _ = await _collect(svc, ask, fetch, trust, cap=None)
    return hits


async def _unindexed(svc: Services, ask: _Ask, vector: np.ndarray, trust: _Trust) -> list[Hit]:
    async def fetch(n: int, attempt: int) -> list[Candidate]:
        return await svc.run(store.exact_unindexed, svc.ch, ask.probe(ask.namespaces, vector), n)

    hits, _ = await _collect(svc, ask, fetch, trust, cap=None)
    return hits


async def _indexed(
    svc: Services,
    ask: _Ask,
    table: str,
    namespaces: tuple[str, ...],
    vector: np.ndarray,
    trust: _Trust,
    share: float,
) -> list[Hit]:
    """By the HNSW index; the index fetches 1.5 / share times more than asked from each
    part, since only `share` of the table's rows pass the namespace and filters. Each
    retry asks 4x more; if that never suffices, the namespaces are scanned exactly."""
    base = 1.5 / max(share, 1e-6)

    async def fetch(n: int, attempt: int) -> list[Candidate]:
        return await svc.run(
            store.nearest, svc.ch, table, ask.probe(namespaces, vector), n, base * GROWTH**attempt
        )

    hits, complete = await _collect(svc, ask, fetch, trust, cap=store.MAX_FETCH)
    if complete:
        return hits
    log.info("conversation.search: index came up short, scanning exactly", namespaces=len(namespaces))
    return await _exact(svc, ask, table, namespaces, vector, trust)


async def _collect(
    svc: Services, ask: _Ask, fetch: Fetch, trust: _Trust, *, cap: int | None
) -> tuple[list[Hit], bool]:
    """Fetch candidates, verify them, and fetch again (GROWTH times more) while
    verification left fewer than `limit` hits and more could exist. Returns the hits and
    whether they are complete (False: an index search ran out of retries)."""
    n = ask.first_fetch
    for attempt in range(RETRIES + 1):
        candidates = await fetch(n, attempt)
        hits = await _verified(svc, ask, candidates, trust)
        if len(hits) >= ask.limit or _exhausted(candidates, n, ask.floor, indexed=cap is not None):
            return hits[: ask.limit], True
        n = n * GROWTH if cap is None else min(cap, n * GROWTH)
    return hits[: ask.limit], cap is None


def _exhausted(candidates: list[Candidate], asked: int, floor: float, *, indexed: bool) -> bool:
    """No better candidate is left to fetch: the last one fetched is already below the
    floor, or (exact scans) fewer rows than asked exist. An index search that returned
    fewer than asked may only have been starved by its post-filter, so it asks again."""
    if candidates and candidates[-1].similarity < floor:
        return True
    return not indexed and len(candidates) < asked


async def _verified(svc: Services, ask: _Ask, candidates: list[Candidate], trust: _Trust) -> list[Hit]:
    """The candidates that are still what they were indexed as, live and not high, as
    hits, best first: the best `limit + VERIFY_SPARE` first, the rest only if those fall
    short. A lookup costs ClickHouse per key (~0.25 ms each, whatever the granule size:
    measured 2026-12-01), and the best few nearly always pass."""
    fresh = _dedupe(c for c in candidates if c.similarity >= ask.floor)
    repeated = {k for k, n in Counter(c.key for c in candidates).items() if n > 1}
    first = ask.limit + VERIFY_SPARE
    hits = await _verified_slice(svc, ask, fresh[:first], trust, repeated)
    if len(hits) < ask.limit and len(fresh) > first:
        hits += await _verified_slice(svc, ask, fresh[first:], trust, repeated)
    hits.sort(key=lambda h: (-(h.similarity or 0.0), h.namespace, h.thread_id, h.msg_id))
    return hits


VECTOR_LEGS = ("vector",)
LEXICAL_LEGS = ("lexical",)


class _Owned(Protocol):
    """What a turn's row says of it: role, run, owner, time (a candidate as written, or
    the row verification read)."""

    @property
    def role(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def ts(self) -> datetime: ...


def _turn_key(c: Candidate | lexical_store.LexicalCandidate) -> TurnKey:
    return TurnKey(c.namespace, c.agent, c.thread_id, c.msg_id)


def _hit(
    at: TurnKey,
    turn: _Owned,
    similarity: float | None,
    excerpt: str,
    score: float | None = None,
    legs: tuple[str, ...] = (),
) -> Hit:
    return Hit(
        *at,
        turn.role,
        turn.run_id,
        turn.user_id,
        as_utc(turn.ts),
        similarity,
        excerpt,
        score,
        legs,
    )


_Kept = tuple[Candidate, _Owned]  # a candidate and what its turn's row says


async def _verified_slice(
    svc: Services, ask: _Ask, fresh: list[Candidate], trust: _Trust, repeated: set[EmbKey]
) -> list[Hit]:
    """The slice's hits: trusted candidates as their rows say, the others verified."""
    if not fresh:
        return []
    unjudged = {(c.namespace, c.thread_id) for c in fresh if c.trusted is None}
    marks = await _read_marks(svc, unjudged) if unjudged else {}
    kept: list[_Kept] = []
    doubted: list[Candidate] = []
    for c in fresh:
        if trust.covers(c, marks, repeated):
            kept.append((c, c))
        else:
            doubted.append(c)
    kept += await _checked(svc, ask, doubted)
    return await _hits(svc, ask, kept)


async def _checked(svc: Services, ask: _Ask, fresh: list[Candidate]) -> list[_Kept]:
    """The candidates whose newest embedding row is their version and live, and whose
    transcript row is live and not high, with what that row says."""
    if not fresh:
        return []
    keys = [c.key for c in fresh]
    emb, turns = await asyncio.gather(
        svc.run(store.verify_embeddings, svc.ch, keys),
        svc.run(store.verify_turns, svc.ch, keys, {c.agent for c in fresh}),
    )
    kept: list[_Kept] = []
    for c in fresh:
        now = emb.get(c.key)
        if now is None or not now.live or now.version != c.version:
            continue  # tombstoned, failed, or re-embedded since this vector
        if (c.model or now.model) != ask.model:
            continue  # another model's vector (a row older than the vector tables' model column)
        turn = turns.get(_turn_key(c))
        if turn is None or not turn.live or turn.high or not turn.recorded:
            continue  # a saved-only row belongs to its user, not to search
        kept.append((c, turn))
    return kept


async def _hits(svc: Services, ask: _Ask, kept: list[_Kept]) -> list[Hit]:
    """Hits of the kept candidates whose shown text (and 1,024 characters past it) does
    not read as high."""
    heads = await _heads(svc, ask, [k[0] for k in kept])
    hits = []
    for c, turn in kept:
        head = heads.get(c.key, c.text)
        if window_reads_as_high(head, ask.shown, SCREEN_PAST):
            continue
        similarity = round(c.similarity, 6)
        hits.append(_hit(_turn_key(c), turn, similarity, head[: ask.shown], similarity, VECTOR_LEGS))
    return hits


def _dedupe(candidates: Iterable[Candidate]) -> list[Candidate]:
    """One candidate per row version, best first. Two versions of one turn (a re-embed
    not merged yet) both stay: verification keeps only the newest, wherever it ranks."""
    seen: set[tuple[str, str, str, int]] = set()
    out = []
    for c in candidates:
        if (*c.key, c.version) not in seen:
            seen.add((*c.key, c.version))
            out.append(c)
    return out


def _text_covers(text: str, window: int) -> bool:
    """Does the embedding row's text hold the turn's first `window` characters? It holds
    the turn's first 2,048 (240 for rows of earlier builds), so a shorter text is the
    whole turn unless it has exactly one of those lengths."""
    return len(text) >= window or len(text) not in (EMBED_CHARS, LEGACY_EMBED_CHARS)


async def _heads(svc: Services, ask: _Ask, candidates: list[Candidate]) -> dict[tuple[str, str, str], str]:
    """The start of each turn whose embedding text is too short to show and screen."""
    short = [c for c in candidates if not _text_covers(c.text, ask.window)]
    if not short:
        return {}
    found = await svc.run(store.heads, svc.ch, [_turn_key(c) for c in short], ask.window)
    return {(k[0], k[2], k[3]): head for k, head in found.items()}


# -- substring mode -----------------------------------------------------------------


async def _by_substring(svc: Services, ask: _Ask, query: str, reason: str) -> SearchResult:
    """Live turns holding the query (case-insensitive), newest first; no similarity."""
    n = ask.first_fetch
    hits: list[Hit] = []
    for _ in range(RETRIES + 1):
        rows = await svc.run(
            store.substring, svc.ch, ask.namespaces, query, ask.filters, fetch=n, chars=ask.window
        )
        hits = [
            _hit(r.turn_key, r, None, r.head[: ask.shown])
            for r in rows
            if not window_reads_as_high(r.head, ask.shown, SCREEN_PAST)
        ]
        if len(hits) >= ask.limit or len(rows) < n:
            break
        n *= GROWTH
    return ask.answer(SUBSTRING, hits[: ask.limit], [SUBSTRING], reason, vectors=False)


# -- lexical and hybrid modes ---------------------------------------------------------


async def _by_words(svc: Services, ask: _Ask, query: str, mode: str, lexical_weight: float) -> SearchResult:
    """Lexical mode, or hybrid mode (module docstring). The lexical leg starts at once
    and runs in ClickHouse while the query is embedded."""
    # The lexical leg of a hybrid search reaches deeper than the page; the vector leg runs
    # exactly as vector mode does (a deeper vector leg fell back to exact scans more
    # often: hybrid cost 248 ms of CPU per search at 100k bench turns, against 71 + 106
    # for the two modes alone).
    depth = replace(ask, limit=min(MAX_LIMIT, ask.limit + LEG_DEPTH)) if mode == HYBRID else ask
    lexical = asyncio.ensure_future(_lexical(svc, depth, query))
    try:
        return await _legs(svc, ask, depth, query, mode, lexical_weight, lexical)
    finally:
        if not lexical.done():  # the vector leg failed (a backend error): nothing waits for it
            lexical.cancel()


async def _legs(
    svc: Services,
    ask: _Ask,
    depth: _Ask,
    query: str,
    mode: str,
    lexical_weight: float,
    lexical: asyncio.Future[list[Hit]],
) -> SearchResult:
    plan = [LEXICAL_PLAN]
    if mode == LEXICAL:
        return ask.answer(LEXICAL, _best_lexical(await lexical, ask.limit), plan, vectors=False)
    fallback = QUERY_HIGH if reads_as_high(query) else None
    vector_hits: list[Hit] = []
    vector_reason: str | None = None  # the vector leg read the engine instead of the index: why
    if fallback is None:
        counting = _count_ahead(svc, ask)
        embedded = await inline.embed(svc, [query], query=True)
        if embedded.ok and embedded.vectors:
            ask = replace(ask, model=embedded.model_id)
            found = await _by_vector(svc, ask, embedded.vectors[0], counting, _trust(svc))
            vector_hits, plan = found.hits, [*found.plan, LEXICAL_PLAN]
            vector_reason = found.fallback_reason
        else:
            await _discard(counting)
            timeout = failures.code_of(embedded.error) == failures.EMBEDDER_TIMEOUT
            fallback = EMBEDDER_TIMEOUT if timeout else EMBEDDER_ERROR
            log.warning("conversation.search: hybrid answered by its lexical leg", reason=fallback)
    lexical_hits = await lexical
    if fallback is not None:
        return ask.answer(LEXICAL, _best_lexical(lexical_hits, ask.limit), plan, fallback, vectors=False)
    fused = fuse(vector_hits, lexical_hits, lexical_weight)
    return ask.answer(HYBRID, fused[: ask.limit], plan, vector_reason)


def _best_lexical(hits: list[Hit], limit: int) -> list[Hit]:
    return hits[:limit]  # already in the leg's own order


def fuse(vector_hits: Sequence[Hit], lexical_hits: Sequence[Hit], lexical_weight: float) -> list[Hit]:
    """Reciprocal rank fusion of the two legs' verified hits (common.rrf_score: the
    lexical leg's share is lexical_weight, the vector leg's the rest). Ties: a hit of
    both legs first, then the better rank, then the key."""
    by_key: dict[tuple[str, str, str], tuple[Hit | None, int | None, Hit | None, int | None]] = {}
    for rank, h in enumerate(vector_hits, 1):
        by_key[(h.namespace, h.thread_id, h.msg_id)] = (h, rank, None, None)
    for rank, h in enumerate(lexical_hits, 1):
        key = (h.namespace, h.thread_id, h.msg_id)
        v, v_rank, _, _ = by_key.get(key, (None, None, None, None))
        by_key[key] = (v, v_rank, h, rank)
    scored: list[tuple[tuple[float, int, int, str, str, str], Hit]] = []
    for key, (v, v_rank, lx, l_rank) in by_key.items():
        score = rrf_score(v_rank, l_rank, lexical_weight)
        if score <= 0:
            continue
        legs = tuple(leg for leg, r in (("vector", v_rank), ("lexical", l_rank)) if r)
        base = v or lx
        assert base is not None
        hit = replace(base, score=round(score, 6), legs=legs, similarity=v.similarity if v else None)
        best_rank = min(r for r in (v_rank, l_rank, 10**9) if r)
        scored.append(((-score, -len(legs), best_rank, *key), hit))
    scored.sort(key=lambda sh: sh[0])
    return [h for _, h in scored]


async def _lexical(svc: Services, ask: _Ask, query: str) -> list[Hit]:
    """The lexical leg's verified hits, best first (at most ask.limit): candidates from
    the postings, checked against the transcript; fetched again (more) while the checks
    left too few and more could exist."""
    n = ask.first_fetch
    hits: list[Hit] = []
    for _ in range(RETRIES + 1):
        candidates = await svc.run(lexical_store.search, svc.ch, ask.namespaces, query, ask.filters, n)
        hits = await _lexical_verified(svc, ask, candidates)
        if len(hits) >= ask.limit or len(candidates) < n or n >= store.MAX_FETCH:
            break
        n = min(store.MAX_FETCH, n * GROWTH)
    return hits[: ask.limit]


async def _lexical_verified(
    svc: Services, ask: _Ask, candidates: list[lexical_store.LexicalCandidate]
) -> list[Hit]:
    """The candidates whose newest transcript row is live, recorded, not high and still
    the text their postings came from, as hits in the leg's order (the best
    `limit + VERIFY_SPARE` first, the rest only if those fall short)."""
    first = ask.limit + VERIFY_SPARE
    hits = await _lexical_slice(svc, ask, candidates[:first])
    if len(hits) < ask.limit and len(candidates) > first:
        hits += await _lexical_slice(svc, ask, candidates[first:])
    return hits


async def _lexical_slice(
    svc: Services, ask: _Ask, candidates: list[lexical_store.LexicalCandidate]
) -> list[Hit]:
    """The slice's hits: each turn's newest row read (without its text) while the
    excerpts are read from the index (see loom.store.transcript_terms)."""
    if not candidates:
        return []
    keys = [_turn_key(c) for c in candidates]
    now, heads = await asyncio.gather(
        svc.run(lexical_store.verify, svc.ch, keys),
        svc.run(lexical_store.heads, svc.ch, [(c.namespace, c.doc) for c in candidates]),
    )
    kept = []
    for c, key in zip(candidates, keys, strict=True):
        turn = now.get(key)
        if turn is None or turn.version != c.version or not turn.live or turn.high or not turn.recorded:
            continue  # gone, tombstoned, high, saved-only, or revised since its postings
        kept.append((c, key, turn))
    short = [key for c, key, _ in kept if not _head_covers(heads.get((c.namespace, c.doc)), ask.window)]
    longer = await svc.run(store.heads, svc.ch, short, ask.window) if short else {}
    hits = []
    for c, key, turn in kept:
        head = longer.get(key) or heads.get((c.namespace, c.doc), "")
        if window_reads_as_high(head, ask.shown, SCREEN_PAST):
            continue
        hits.append(_hit(key, turn, None, head[: ask.shown], round(c.score, 6), LEXICAL_LEGS))
    return hits


def _head_covers(head: str | None, window: int) -> bool:
    """Does the index's head hold the turn's first `window` characters? It holds the
    first HEAD_CHARS, so a shorter head is the whole text (None: not found, read the
    transcript)."""
    return head is not None and (len(head) >= window or len(head) < lexical_store.HEAD_CHARS)
