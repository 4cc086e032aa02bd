"""SQL of the saved-message ops: the transcript row a save or unsave decides on, the
ownership claim, the unsave revisions, and the per-user reads (listing, status,
vector leg, verification).

The transcript row (loom.conversations) is the truth. The per-user indexes of
clickhouse_schema/003_saved.sql (saved_docs, saved_terms, saved_vectors) only propose
candidates; every read that answers a client re-checks them here (:func:`verify`,
:func:`heads`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.store import conversations as conv_store
from loom.store import transcript_postings
from loom.store.clickhouse import key_sets
from loom.store.keys import TurnKey
from loom.store.rows import decoded, json_object, named

Pair = tuple[str, str]  # (thread_id, msg_id)

_KEY_WHERE = (
    "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String} AND msg_id = {m:String}"
)


def _key_params(key: TurnKey) -> dict[str, Any]:
    return {"ns": key[0], "ag": key[1], "th": key[2], "m": key[3]}


@dataclass(frozen=True)
class TranscriptRow:
    """The newest version of one transcript row, as a save or unsave decides on it."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    ts: datetime
    role: str
    content: str
    user_id: str
    run_id: str
    is_summary: bool
    high_sensitivity: bool
    is_saved: bool
    saved_at: datetime | None
    tombstoned: bool
    origin: str = conv_store.RECORDED
    metadata: dict[str, Any] = field(default_factory=dict)  # a save embeds behind its speaker

    @property
    def saved_only(self) -> bool:
        """Stored by a save alone: not part of the namespace's transcript."""
        return self.origin == conv_store.SAVED_ONLY

    @property
    def key(self) -> TurnKey:
        return TurnKey(self.namespace, self.agent, self.thread_id, self.msg_id)


_TRANSCRIPT = conv_store.TABLE.reader(TranscriptRow, metadata=json_object)
_ROW_COLUMNS = _TRANSCRIPT.read_list


def transcript_row(ch: Client, key: TurnKey) -> TranscriptRow | None:
    rows = ch.query(
        f"SELECT {_ROW_COLUMNS} FROM conversations FINAL WHERE {_KEY_WHERE}", parameters=_key_params(key)
    )
    return next(iter(_TRANSCRIPT.rows(rows)), None)


def copies(ch: Client, namespace: str, thread_id: str, msg_id: str) -> list[TranscriptRow]:
    """Every agent's live copy of one turn (the copies share one embedding row)."""
    rows = ch.query(
        f"SELECT {_ROW_COLUMNS} FROM conversations FINAL WHERE namespace = {{ns:String}} "
        "AND thread_id = {th:String} AND msg_id = {m:String} AND NOT tombstoned ORDER BY agent",
        parameters={"ns": namespace, "th": thread_id, "m": msg_id},
    )
    return _TRANSCRIPT.rows(rows)


# A revision of one transcript row with some columns replaced, written by the engine
# from the row's newest version: the WHERE clause is the revision's condition, so a
# row that no longer satisfies it (another user claimed it, it was tombstoned) gets no
# revision at all (conversations' Table.revise).


def _revise(
    ch: Client, key: TurnKey, replaced: dict[str, str], condition: str, params: dict[str, Any], version: int
) -> None:
    conv_store.TABLE.revise(
        ch, replaced, f"{_KEY_WHERE} AND {condition}", {**_key_params(key), **params, "v": version}
    )
    # The postings carry the owner and version (and a saved-only row that became
    # recorded gets its first ones); a revision that wrote nothing rewrites them as they were.
    transcript_postings.rewrite(ch, key)


def claim(ch: Client, key: TurnKey, user_id: str, saved_at: datetime, version: int) -> None:
    """Flag the row saved for `user_id`, claiming it, only if no user owns it or
    `user_id` does and it is live: of two users saving one unowned row under the thread
    lease the second finds it owned and writes nothing. The caller reads the row back."""
    saved_ms = int(saved_at.timestamp() * 1000)
    _revise(
        ch,
        key,
        {
            "user_id": "{u:String}",
            "is_saved": "true",
            "saved_at": "fromUnixTimestamp64Milli({sa:Int64}, 'UTC')",
        },
        "user_id IN ('', {u:String}) AND NOT tombstoned",
        {"u": user_id, "sa": saved_ms},
        version,
    )


def unflag(ch: Client, key: TurnKey, user_id: str, version: int) -> None:
    """Clear the saved flag of `user_id`'s row. `saved_at` stays: the revision then
    still reaches the per-user indexes (their views take rows that are or were saved)
    and retires the saved version there."""
    _revise(ch, key, {"is_saved": "false"}, "user_id = {u:String} AND is_saved", {"u": user_id}, version)


def record(ch: Client, key: TurnKey, version: int) -> None:
    """Make a saved-only row recorded (an append of the turn while the namespace
    records): only the origin changes, and only of a live saved-only row."""
    _revise(
        ch,
        key,
        {"origin": f"'{conv_store.RECORDED}'"},
        f"origin = '{conv_store.SAVED_ONLY}' AND NOT tombstoned",
        {},
        version,
    )


def remove(ch: Client, key: TurnKey, user_id: str) -> None:
    """Remove every version of the row (lightweight DELETE): it existed only because
    of the save. Its text goes from the per-user indexes too (their views see inserts,
    not deletes), postings first: they are found through saved_docs."""
    params = {**_key_params(key), "u": user_id}
    ch.command(f"DELETE FROM conversations WHERE {_KEY_WHERE}", parameters=params)
    ch.command(
        "DELETE FROM saved_terms WHERE namespace = {ns:String} AND user_id = {u:String} AND doc IN ("
        f"SELECT doc FROM saved_docs WHERE user_id = {{u:String}} AND {_KEY_WHERE})",
        parameters=params,
    )
    ch.command(f"DELETE FROM saved_docs WHERE user_id = {{u:String}} AND {_KEY_WHERE}", parameters=params)


# -- reads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedEntry:
    """A saved row as the listing index has it."""

    thread_id: str
    msg_id: str
    agent: str
    role: str
    ts: datetime
    saved_at: datetime | None
    sort_us: int  # the listing's order: saved_at, or ts where none was recorded (µs)


def saved_page(
    ch: Client,
    namespace: str,
    user_id: str,
    *,
    limit: int,
    thread_id: str | None = None,
    after: tuple[int, str, str, str] | None = None,
) -> list[SavedEntry]:
    """The user's saved rows, most recently saved first, after the keyset position
    (sort µs, thread_id, msg_id, agent). From the index: the caller verifies."""
    where = ["namespace = {ns:String}", "user_id = {u:String}", "is_saved", "NOT tombstoned"]
    params: dict[str, Any] = {"ns": namespace, "u": user_id, "lim": limit}
    if thread_id is not None:
        where.append("thread_id = {th:String}")
        params["th"] = thread_id
    having = ""
    if after is not None:
        having = (
            "WHERE (sort_us, thread_id, msg_id, agent) < ({at:Int64}, {ath:String}, {am:String}, {aa:String})"
        )
        params["at"], params["ath"], params["am"], params["aa"] = after
    rows = ch.query(
        "SELECT thread_id, msg_id, agent, role, ts, saved_at, sort_us FROM ("
        "SELECT thread_id, msg_id, toString(agent) AS agent, toString(role) AS role, ts, saved_at, "
        "toUnixTimestamp64Micro(ifNull(toDateTime64(saved_at, 6, 'UTC'), ts)) AS sort_us "
        f"FROM saved_docs FINAL WHERE {' AND '.join(where)}) {having} "
        "ORDER BY sort_us DESC, thread_id DESC, msg_id DESC, agent DESC LIMIT {lim:UInt32}",
        parameters=params,
    )
    return [decoded(SavedEntry, r) for r in named(rows)]


@dataclass(frozen=True)
class Head:
    """A saved row's start, read from the transcript (the truth)."""

    role: str
    ts: datetime
    saved_at: datetime | None
    head: str


def heads(
    ch: Client, namespace: str, user_id: str, keys: Iterable[TurnKey], chars: int
) -> dict[TurnKey, Head]:
    """For each named row that the transcript still holds saved for `user_id`, live:
    its first `chars` characters."""
    keys = list(keys)
    if not keys:
        return {}
    rows = _confirmed(
        ch, namespace, user_id, [(k[2], k[3]) for k in keys], "leftUTF8(d.content, {n:UInt32})", {"n": chars}
    )
    wanted = set(keys)
    out: dict[TurnKey, Head] = {}
    for r in rows:
        key = (namespace, r["ag"], r["th"], r["mid"])
        if key in wanted:
            out[key] = decoded(Head, r, _CONFIRMED_ALIASES)
    return out


# The fields of Head and Verified by the aliases _confirmed() reads them under (apart from
# the columns its join filters on).
_CONFIRMED_ALIASES = {
    "agent": "ag",
    "role": "role_name",
    "ts": "turn_ts",
    "saved_at": "saved",
    "head": "body",
    "content": "body",
    "high_sensitivity": "high",
}


def _confirmed(
    ch: Client, namespace: str, user_id: str, pairs: Sequence[Pair], text_expr: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of saved_docs for `pairs` that the transcript confirms are saved by
    `user_id` and live (every copy, most recently saved first), with `text_expr` of the
    text. The text comes from saved_docs, whose small granules hold only saved
    messages; the transcript is read without its text, only to confirm each row."""
    rows = ch.query(
        "SELECT d.thread_id AS th, d.msg_id AS mid, toString(d.agent) AS ag, toString(d.role) AS role_name, "
        f"d.ts AS turn_ts, d.saved_at AS saved, {text_expr} AS body, d.high_sensitivity AS high "
        "FROM saved_docs AS d FINAL "
        "WHERE d.namespace = {ns:String} AND d.user_id = {u:String} AND d.thread_id IN {th:Array(String)} "
        "AND d.msg_id IN {ids:Array(String)} AND d.is_saved AND NOT d.tombstoned "
        "AND (d.thread_id, d.msg_id, d.agent) IN ("
        "  SELECT thread_id, msg_id, agent FROM conversations FINAL WHERE namespace = {ns:String} "
        "  AND thread_id IN {th:Array(String)} AND msg_id IN {ids:Array(String)} "
        "  AND user_id = {u:String} AND is_saved AND NOT tombstoned) "
        "ORDER BY d.saved_at DESC",
        parameters={"ns": namespace, "u": user_id, **key_sets(pairs, th=0, ids=1), **params},
    )
    return list(named(rows))


def saved_ids(ch: Client, namespace: str, user_id: str, thread_id: str, msg_ids: Sequence[str]) -> set[str]:
    """Which of `msg_ids` the transcript holds saved for `user_id`, live, in the thread
    (under any agent)."""
    rows = ch.query(
        "SELECT DISTINCT msg_id FROM conversations FINAL WHERE namespace = {ns:String} AND thread_id = {th:String} "
        "AND msg_id IN {ids:Array(String)} AND user_id = {u:String} AND is_saved AND NOT tombstoned",
        parameters={"ns": namespace, "th": thread_id, "ids": sorted(set(msg_ids)), "u": user_id},
    )
    return {r["msg_id"] for r in named(rows)}


@dataclass(frozen=True)
class VectorHit:
    thread_id: str
    msg_id: str
    similarity: float


def vector_search(
    ch: Client,
    namespace: str,
    user_id: str,
    vector: np.ndarray,
    model: str,
    *,
    limit: int,
    min_similarity: float,
    thread_id: str | None = None,
) -> list[VectorHit]:
    """The user's saved messages by cosine similarity to `vector` (vectors of the same
    model only), at least `min_similarity`, best first."""
    where = [
        "namespace = {ns:String}",
        "user_id = {u:String}",
        "live",
        "model = {model:String}",
        "length(vector) = {dim:UInt32}",
    ]
    params: dict[str, Any] = {
        "ns": namespace,
        "u": user_id,
        "model": model,
        "dim": int(vector.shape[0]),
        "q": vector.astype(np.float32).tolist(),
        "floor": min_similarity,
        "lim": limit,
    }
    if thread_id is not None:
        where.append("thread_id = {th:String}")
        params["th"] = thread_id
    rows = ch.query(
        "SELECT thread_id, msg_id, sim FROM (SELECT thread_id, msg_id, "
        "1 - cosineDistance(vector, {q:Array(Float32)}) AS sim "
        f"FROM saved_vectors FINAL WHERE {' AND '.join(where)}) WHERE sim >= {{floor:Float64}} "
        "ORDER BY sim DESC, thread_id, msg_id LIMIT {lim:UInt32}",
        parameters=params,
    )
    return [decoded(VectorHit, r, {"similarity": "sim"}) for r in named(rows)]


@dataclass(frozen=True)
class Verified:
    """A search candidate as the transcript holds it: saved by the user, live."""

    agent: str
    role: str
    ts: datetime
    saved_at: datetime | None
    content: str
    high_sensitivity: bool


def verify(ch: Client, namespace: str, user_id: str, pairs: Iterable[Pair]) -> dict[Pair, Verified]:
    """The named messages the transcript holds saved for `user_id` and live (one copy
    each, the most recently saved), with their whole text."""
    pairs = list(pairs)
    if not pairs:
        return {}
    wanted = set(pairs)
    out: dict[Pair, Verified] = {}
    for r in _confirmed(ch, namespace, user_id, pairs, "d.content", {}):
        pair = (r["th"], r["mid"])
        if pair in wanted and pair not in out:
            out[pair] = decoded(Verified, r, _CONFIRMED_ALIASES)
    return out
