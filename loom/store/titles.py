"""SQL of the conversation_titler: the threads a pass may title, and their first turns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from clickhouse_connect.driver.client import Client

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


def first_turns(ch: Client, c: Candidate, count: int) -> list[FirstTurn]:
    """The thread's first `count` live recorded user and assistant turns."""
    rows = ch.query(
        "SELECT toString(role) AS role, content, high_sensitivity FROM conversations FINAL "
        "WHERE namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String} AND NOT tombstoned "
        f"AND {IS_RECORDED} AND role IN ('user', 'assistant') ORDER BY ts, msg_id LIMIT {{n:UInt32}}",
        parameters={"ns": c.namespace, "ag": c.agent, "th": c.thread_id, "n": count},
    ).named_results()
    return [FirstTurn(r["role"], r["content"], bool(r["high_sensitivity"])) for r in rows]
