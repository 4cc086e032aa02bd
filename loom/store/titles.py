"""SQL of the conversation_titler: the threads a pass may title, and their first turns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.store import threads as thread_store
from loom.store.clickhouse import key_sets
from loom.store.conversations import IS_RECORDED


@dataclass(frozen=True)
class Candidate:
    namespace: str
    agent: str
    thread_id: str


def candidates(
    ch: Client,
    since: datetime,
    min_turns: int,
    limit: int,
    refused_key: str,
    namespaces: Sequence[str] | None = None,
) -> list[Candidate]:
    """Untitled live threads of namespaces that record conversations (and make model
    calls), active since `since` with at least `min_turns` live recorded turns and no
    refusal mark, the most recently active first.

    The threads table (a row per thread) picks the untitled ones first; only their turns
    are then counted, through the transcript's primary key."""
    only = "AND namespace IN {only:Array(String)} " if namespaces is not None else ""
    rows = ch.query(
        "SELECT toString(namespace) AS namespace, toString(agent) AS agent, thread_id, count() AS turns, "
        "max(ts) AS last_ts FROM conversations FINAL "
        "WHERE (namespace, agent, thread_id) IN ("
        "  SELECT namespace, agent, thread_id FROM threads FINAL WHERE NOT tombstoned AND title = '' "
        "  AND NOT JSONHas(metadata, {mark:String}) "
        + only
        + "AND namespace IN (SELECT namespace FROM namespaces "
        "  FINAL WHERE conversation_logging_enabled AND model_calls_enabled)) "
        f"AND NOT tombstoned AND {IS_RECORDED} " + only + "GROUP BY namespace, agent, thread_id "
        "HAVING turns >= {min:UInt32} AND last_ts >= {since:DateTime64(6, 'UTC')} "
        "ORDER BY last_ts DESC, namespace, agent, thread_id LIMIT {lim:UInt32}",
        parameters={
            "since": since,
            "min": min_turns,
            "lim": limit,
            "mark": refused_key,
            "only": list(namespaces or []),
        },
    ).named_results()
    return [Candidate(r["namespace"], r["agent"], r["thread_id"]) for r in rows]


@dataclass(frozen=True)
class FirstTurn:
    role: str
    content: str
    high: bool


def _key(c: Candidate) -> tuple[str, str, str]:
    return (c.namespace, c.agent, c.thread_id)


_CANDIDATES_WHERE = (
    "namespace IN {ns:Array(String)} AND agent IN {ag:Array(String)} AND thread_id IN {th:Array(String)}"
)


def first_turns_of(ch: Client, found: Sequence[Candidate], count: int) -> dict[Candidate, list[FirstTurn]]:
    """The first `count` live recorded user and assistant turns of every candidate, in
    one statement (every statement costs the engine milliseconds)."""
    if not found:
        return {}
    rows = ch.query(
        "SELECT toString(namespace) AS namespace, toString(agent) AS agent, thread_id, toString(role) AS role, "
        f"content, high_sensitivity FROM conversations FINAL WHERE {_CANDIDATES_WHERE} AND NOT tombstoned "
        f"AND {IS_RECORDED} AND role IN ('user', 'assistant') "
        "ORDER BY namespace, agent, thread_id, ts, msg_id LIMIT {n:UInt32} BY namespace, agent, thread_id",
        parameters={**key_sets([_key(c) for c in found], ns=0, ag=1, th=2), "n": count},
    ).named_results()
    out: dict[Candidate, list[FirstTurn]] = {c: [] for c in found}
    for r in rows:
        c = Candidate(r["namespace"], r["agent"], r["thread_id"])
        if c in out:
            out[c].append(FirstTurn(r["role"], r["content"], bool(r["high_sensitivity"])))
    return out


def threads_of(ch: Client, found: Sequence[Candidate]) -> dict[Candidate, thread_store.ThreadRow]:
    """The newest thread row of every candidate that has one, in one statement."""
    if not found:
        return {}
    rows = ch.query(
        thread_store._SELECT + "WHERE " + _CANDIDATES_WHERE,
        parameters=key_sets([_key(c) for c in found], ns=0, ag=1, th=2),
    )
    wanted = set(found)
    out = {}
    for r in thread_store.TABLE.rows(rows):
        c = Candidate(r.namespace, r.agent, r.thread_id)
        if c in wanted:
            out[c] = r
    return out
