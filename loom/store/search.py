"""SQL of conversation.search: candidates from the vector tables, their verification
against the newest rows, and the substring fallback over loom.conversations.

The vector tables (``conversation_vectors_<dim>``, migration 002) are indexes kept by
ClickHouse from inserts into conversation_embeddings; they may hold older versions of a
row (a re-embed not merged yet, a turn tombstoned since). A candidate is therefore only
a candidate: :func:`verify` reads the newest embedding row and transcript row of each.

Two ways to rank one namespace's vectors:

* **exact** (:func:`exact`): ``WHERE namespace IN (...)`` on the primary key, so only
  the namespace's (or thread's) rows are read, and every distance is computed. Its cost
  grows with the rows scanned.
* **index** (:func:`nearest`): the HNSW index of each part. ClickHouse falls back to an
  exact scan of the surviving ranges when a filter can be evaluated on the primary key,
  so the key columns are compared through ``identity()``: the filter then runs after the
  index (post-filtering), which fetches ``vector_search_index_fetch_multiplier`` times
  more neighbours to make up for the rows the filter drops.

Similarities are computed by ClickHouse (the index answers from its graph): both ways
rank the same BFloat16 vectors (migration 004), so they report the same numbers, and no
vector travels back (30 vectors cost more to send and parse than to rank).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.query import QueryResult

from loom.read_index.feed import TurnCopy
from loom.read_index.vectors import TurnFilters
from loom.store.by_key import embedding_columns, turn_columns
from loom.store.clickhouse import key_sets
from loom.store.keys import EmbKey, TurnKey, TurnRef
from loom.store.rows import KEY_ALIASES, decoded, named

# The dimensions migration 002 gave a vector table; other lengths are scanned exactly
# over conversation_embeddings (:func:`exact_unindexed`).
VECTOR_TABLES: dict[int, str] = {384: "conversation_vectors_384", 1536: "conversation_vectors_1536"}

# ClickHouse refuses the index for a LIMIT above max_limit_for_vector_search_queries (1000).
MAX_FETCH = 1000
# HNSW's ef_search. Measured on 1M bench vectors (bench/results/2026-12-01-1014-search.txt data), recall@10
# against exact search was 0.81 at ClickHouse's default 256, 0.92 at 512 and 0.95 at
# 1024, for about 1 ms more per query; fetching more candidates did not raise it.
HNSW_EF = 1024

SEARCHED_ROLES = ("user", "assistant")  # plus compaction summaries (system, is_summary)


@dataclass(frozen=True)
class Filters(TurnFilters):
    """The optional filters of a search; None means "any". `since` and `until` bound the
    turn's time (``since <= ts < until``: time phrases of the query, loom.query_time)."""

    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Candidate(TurnCopy):
    """A vector row as the vector table holds it, with its exact cosine similarity. Its
    user_id and ts: the turn's owner and time as the row was written (migration 006; ''
    and 1970 in rows written before it)."""

    ts: datetime
    text: str
    similarity: float
    model: str = ""  # the model that made the vector ('' in rows written before migration 022)
    # From the read index: whether it may be answered as held (loom.read_index.state);
    # None: the search marks decide, read after the candidates.
    trusted: bool | None = None

    @property
    def key(self) -> EmbKey:
        return EmbKey(self.namespace, self.thread_id, self.msg_id)


def _where(filters: Filters, params: dict[str, Any], *, hide_key: bool) -> list[str]:
    """Conditions for the filters. `hide_key` wraps the primary-key columns in identity()
    so ClickHouse does not turn the index query into an exact scan (module docstring)."""

    def key(col: str) -> str:
        return f"identity({col})" if hide_key else col

    return [f"{key('namespace')} IN {{ns:Array(String)}}", *filter_conditions(filters, params, key=key)]


def _of_model(model: str, params: dict[str, Any]) -> str:
    """Vectors of `model`, and rows older than the model column ('': their embedding row
    names the model, and verification checks it there)."""
    params["model"] = model
    return "model IN ({model:String}, '')"


def filter_conditions(
    filters: Filters, params: dict[str, Any], *, key: Callable[[str], str] = str
) -> list[str]:
    """The conditions of a search's optional filters (thread, run, role, agent, time),
    their values added to `params`; `key` wraps a primary-key column (see :func:`_where`)."""
    out = []
    if filters.thread_id is not None:
        out.append(f"{key('thread_id')} = {{th:String}}")
        params["th"] = filters.thread_id
    for value, condition, name in (
        (filters.run_id, "run_id = {run:String}", "run"),
        (filters.role, "role = {role:String}", "role"),
        (filters.agent, "agent = {ag:String}", "ag"),
        (filters.since, "ts >= {since:DateTime64(6, 'UTC')}", "since"),
        (filters.until, "ts < {until:DateTime64(6, 'UTC')}", "until"),
    ):
        if value is not None:
            out.append(condition)
            params[name] = value
    return out


# The query vector travels as hex of its float32 bytes: parsing 384 floats from text
# costs the server ~2 ms per query, unhex + reinterpret next to nothing. It is a
# constant expression, so ClickHouse still matches it against the HNSW index.
QUERY_VECTOR = "reinterpret(unhex({qv:String}), 'Array(Float32)')"


def _vector_param(vector: np.ndarray) -> str:
    return np.asarray(vector, dtype="<f4").tobytes().hex()


def counts(
    ch: Client, table: str, namespaces: Sequence[str], filters: Filters, model: str
) -> tuple[dict[str, int], int]:
    """Rows of `model` of each namespace that pass the filters (stale versions included:
    a planning estimate), and the rows of the whole table (the index post-filters
    against those)."""
    params: dict[str, Any] = {"ns": list(namespaces)}
    where = " AND ".join([*_where(filters, params, hide_key=False), _of_model(model, params)])
    rows = ch.query(
        f"SELECT toString(namespace) AS ns, count() AS n FROM {table} WHERE {where} GROUP BY namespace "
        f"UNION ALL SELECT '' AS ns, count() AS n FROM {table}",
        parameters=params,
    )
    per_ns: dict[str, int] = {}
    total = 0
    for r in named(rows):
        if r["ns"] == "":
            total = int(r["n"])
        else:
            per_ns[r["ns"]] = int(r["n"])
    return per_ns, max(total, sum(per_ns.values()))


# The similarity column; NaN (a zero vector) ranks as 0. ORDER BY keeps the bare
# cosineDistance expression: that is what ClickHouse matches against the HNSW index.
_SIMILARITY = f"ifNotFinite(1 - cosineDistance(embedding, {QUERY_VECTOR}), 0)"
# Aliases other than the columns' own names: an alias that shadows a column would stand
# for it in the WHERE too.
_CANDIDATE_COLUMNS = (
    "toString(namespace) AS ns, thread_id, msg_id, version, toString(agent) AS ag, "
    f"toString(role) AS role_name, run_id, user_id, ts, text, {_SIMILARITY} AS sim, toString(model) AS vmodel"
)


_CANDIDATE_ALIASES = {**KEY_ALIASES, "similarity": "sim", "model": "vmodel"}


def _candidates(result: QueryResult) -> list[Candidate]:
    out = [decoded(Candidate, r, _CANDIDATE_ALIASES) for r in named(result)]
    out.sort(key=lambda c: (-c.similarity, c.key))
    return out


@dataclass(frozen=True)
class Probe:
    """What one vector read compares: the query vector of `model`, against the rows of
    `namespaces` that `filters` keep."""

    namespaces: Sequence[str]
    vector: np.ndarray
    filters: Filters
    model: str

    def params(self, fetch: int) -> dict[str, Any]:
        return {"ns": list(self.namespaces), "qv": _vector_param(self.vector), "n": fetch}

    def where(self, params: dict[str, Any], *, hide_key: bool) -> str:
        """The filters' and the model's condition (its parameters added to `params`)."""
        return " AND ".join([*_where(self.filters, params, hide_key=hide_key), _of_model(self.model, params)])


def _ranked(
    ch: Client, source: str, where: str, params: dict[str, Any], settings: str = ""
) -> list[Candidate]:
    """The candidates of `source` (a table, FINAL or not) that `where` keeps, nearest first
    (``{n}`` of them), with the query's `settings` (the SETTINGS clause, or none)."""
    rows = ch.query(
        f"SELECT {_CANDIDATE_COLUMNS} FROM {source} WHERE {where} "
        f"ORDER BY cosineDistance(embedding, {QUERY_VECTOR}) LIMIT {{n:UInt32}}{settings}",
        parameters=params,
    )
    return _candidates(rows)


def exact(ch: Client, table: str, probe: Probe, fetch: int) -> list[Candidate]:
    """The `fetch` nearest rows by an exact scan of the namespaces' (or thread's) rows."""
    params = probe.params(fetch)
    where = probe.where(params, hide_key=False)
    settings = " SETTINGS vector_search_filter_strategy = 'prefilter', use_skip_indexes = 0"
    return _ranked(ch, table, where, params, settings)


def nearest(ch: Client, table: str, probe: Probe, fetch: int, multiplier: float) -> list[Candidate]:
    """The `fetch` nearest rows by the HNSW index, post-filtered to the probe's
    namespaces, filters and model; the index fetches `multiplier` times more from each
    part to make up for the rows of other namespaces (and models, and filtered out)
    among its neighbours."""
    params = probe.params(min(fetch, MAX_FETCH))
    where = probe.where(params, hide_key=True)
    mult = min(1000.0, max(1.0, float(multiplier)))
    settings = (
        f" SETTINGS vector_search_filter_strategy = 'postfilter', vector_search_index_fetch_multiplier = {mult:.3f}, "
        f"hnsw_candidate_list_size_for_search = {HNSW_EF}"
    )
    return _ranked(ch, table, where, params, settings)


def exact_unindexed(ch: Client, probe: Probe, fetch: int) -> list[Candidate]:
    """For a dimension with no vector table: an exact scan of conversation_embeddings
    (newest versions, live vectors of the query's model and length, of recorded turns
    only: the vector tables' feeds take no other, migration 007)."""
    params = {**probe.params(fetch), "dim": int(np.asarray(probe.vector).shape[0]), "model": probe.model}
    where = " AND ".join(_where(probe.filters, params, hide_key=False))
    live = (
        "length(embedding) = {dim:UInt32} AND model = {model:String} AND error = '' AND NOT tombstoned "
        "AND origin = 'recorded'"
    )
    return _ranked(ch, "conversation_embeddings FINAL", f"{where} AND {live}", params)


@dataclass(frozen=True)
class EmbeddingNow:
    """The newest version of an embedding row, as far as search cares."""

    version: int
    live: bool  # not tombstoned, no error, has a vector
    model: str = ""  # the model of its vector


@dataclass(frozen=True)
class TurnNow:
    """The newest version of a transcript row, as far as search cares."""

    role: str
    run_id: str
    user_id: str
    ts: datetime
    live: bool  # not tombstoned
    high: bool  # high_sensitivity
    recorded: bool = True  # origin 'recorded': part of the transcript (a saved-only row never is)


# verify_embeddings() and verify_turns() are two statements, not one UNION ALL: run at
# once from two threads they answer in the time of the slower one (10.7 ms for 13 keys
# at 100k turns), while the UNION ALL took 15.9 (measured 2026-12-01). A third one for
# the texts (leaving them out of the candidates) cost more than it saved: 2 cores.


def verify_embeddings(
    ch: Client, keys: Sequence[tuple[str, str, str]]
) -> dict[tuple[str, str, str], EmbeddingNow]:
    """The newest embedding row of each key."""
    found = embedding_columns(
        ch,
        [EmbKey(*k) for k in keys],
        # embedding.size0, not length(embedding): under FINAL the latter reads every vector.
        "version, toUInt8(NOT tombstoned AND error = '' AND embedding.size0 > 0) AS live, toString(model) AS emodel",
    )
    return {key: decoded(EmbeddingNow, r, {"model": "emodel"}) for key, r in found.items()}


def verify_turns(
    ch: Client, keys: Sequence[tuple[str, str, str]], agents: Iterable[str]
) -> dict[TurnKey, TurnNow]:
    """The newest transcript row of each (key, agent) for the named agents."""
    if not keys:
        return {}
    rows = ch.query(
        "SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, toUInt8(NOT tombstoned) AS live, "
        "toUInt8(high_sensitivity) AS high, toString(role) AS role_name, run_id, user_id, ts, "
        "toUInt8(origin = 'recorded') AS recorded "
        "FROM conversations FINAL WHERE namespace IN {ns:Array(String)} AND agent IN {ag:Array(String)} "
        "AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)}",
        parameters={**key_sets(keys, ns=0, th=1, ids=2), "ag": sorted(set(agents))},
    )
    wanted = set(keys)
    return {
        TurnKey(r["ns"], r["ag"], r["thread_id"], r["msg_id"]): decoded(TurnNow, r, KEY_ALIASES)
        for r in named(rows)
        if (r["ns"], r["thread_id"], r["msg_id"]) in wanted
    }


def heads(ch: Client, keys: Sequence[TurnKey], chars: int) -> dict[TurnKey, str]:
    """The first `chars` characters of each named turn (for an embedding row whose text
    is shorter than what the excerpt and its screen need: rows of earlier builds)."""
    found = turn_columns(ch, keys, "leftUTF8(content, {n:UInt32}) AS head", {"n": chars})
    return {key: r["head"] for key, r in found.items()}


@dataclass(frozen=True)
class TextMatch(TurnRef):
    """A live, searchable turn whose content holds the needle."""

    head: str  # the first `chars` characters of the content


def substring(
    ch: Client, namespaces: Sequence[str], needle: str, filters: Filters, *, fetch: int, chars: int
) -> list[TextMatch]:
    """Live recorded turns of the kinds search covers (user and assistant turns,
    compaction summaries) that hold `needle`, case-insensitively, newest first (a
    saved-only row is never part of the transcript). Turns marked high
    are left out here; the caller screens what it would show."""
    params: dict[str, Any] = {
        "ns": list(namespaces),
        "needle": needle,
        "n": fetch,
        "chars": chars,
        "roles": list(SEARCHED_ROLES),
    }
    where = _where(filters, params, hide_key=False)
    rows = ch.query(
        "SELECT toString(namespace) AS ns, toString(agent) AS ag, thread_id, msg_id, toString(role) AS role_name, "
        "run_id, user_id, ts, leftUTF8(content, {chars:UInt32}) AS head FROM conversations FINAL "
        f"WHERE {' AND '.join(where)} AND NOT tombstoned AND NOT high_sensitivity AND origin = 'recorded' "
        "AND (role IN {roles:Array(String)} OR is_summary) "
        "AND positionCaseInsensitiveUTF8(content, {needle:String}) > 0 "
        "ORDER BY ts DESC, msg_id DESC LIMIT {n:UInt32}",
        parameters=params,
    )
    return [decoded(TextMatch, r, KEY_ALIASES) for r in named(rows)]
