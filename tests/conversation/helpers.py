"""Direct reads and writes of the conversation tables, for assertions and for playing
the parts of ops that come later (a tombstone from delete/compaction, a save)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from loom.clock import next_version
from loom.models.conversation.reading import TurnIn
from loom.models.conversation.saved import SaveRequest
from loom.store import search_marks

# Set by the conversation tests' session fixture: a sync Redis client, so the helpers
# below that play later ops' writes also do what those ops must (raise search's marks).
marks_redis: Any = None


def turn(thread_id: str, role: str, content: str, **fields: Any) -> TurnIn:
    """A turn as conversation.append takes it, the three fields every turn has first."""
    return TurnIn(thread_id=thread_id, role=role, content=content, **fields)


def alice_saves(ns: str, conversation_id: str, message_id: str = "m", **fields: Any) -> SaveRequest:
    """conversation.save_message of alice's message (role and content: one not in the transcript)."""
    return SaveRequest(
        namespace=ns, user_id="alice", conversation_id=conversation_id, message_id=message_id, **fields
    )


def raise_marks(ch: Any, ns: str, thread_id: str = search_marks.WHOLE) -> None:
    """What every writer that rewrites or removes existing rows does first and last
    (and migration 006 did for the rows of earlier builds): loom.store.search_marks."""
    search_marks.record(ch, [(ns, thread_id)], time.time_ns() + search_marks.CLOCK_MARGIN_NS)
    if marks_redis is not None:
        marks_redis.delete(search_marks.key(ns))  # the cache reloads from ClickHouse, the truth


def turn_rows(ch: Any, ns: str, *, final: bool = True) -> list[dict[str, Any]]:
    result = ch.query(
        f"SELECT * FROM conversations {'FINAL' if final else ''} WHERE namespace = {{ns:String}} "
        "ORDER BY ts, msg_id",
        parameters={"ns": ns},
    )
    return [dict(zip(result.column_names, r, strict=True)) for r in result.result_rows]


def emb_rows(ch: Any, ns: str) -> list[dict[str, Any]]:
    result = ch.query(
        "SELECT * FROM conversation_embeddings FINAL WHERE namespace = {ns:String} "
        "ORDER BY thread_id, msg_id",
        parameters={"ns": ns},
    )
    return [dict(zip(result.column_names, r, strict=True)) for r in result.result_rows]


def emb_row(ch: Any, ns: str, thread_id: str, msg_id: str) -> Any:
    """The row as a dict, or None."""
    for row in emb_rows(ch, ns):
        if row["thread_id"] == thread_id and row["msg_id"] == msg_id:
            return row
    return None


_TURN_COLS = (
    "namespace, agent, thread_id, msg_id, ts, role, content, reasoning, user_id, run_id, metadata, tokens, "
    "high_sensitivity, is_summary, is_saved, saved_at, tombstoned, tombstoned_at, tombstone_reason, origin, version"
)


def revise_turn(ch: Any, ns: str, agent: str, thread_id: str, msg_id: str, **changes: str) -> None:
    """Insert a newer version of a turn with some columns replaced by SQL expressions."""
    raise_marks(ch, ns, thread_id)
    exprs = {c.strip(): c.strip() for c in _TURN_COLS.split(",")}
    exprs.update(changes)
    exprs["version"] = str(next_version())
    ch.command(
        f"INSERT INTO conversations ({_TURN_COLS}) SELECT {', '.join(exprs.values())} FROM conversations FINAL "
        "WHERE namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String} AND msg_id = {m:String}",
        parameters={"ns": ns, "ag": agent, "th": thread_id, "m": msg_id},
    )


def tombstone_turn(
    ch: Any, ns: str, agent: str, thread_id: str, msg_id: str, reason: str = "deleted"
) -> None:
    revise_turn(
        ch,
        ns,
        agent,
        thread_id,
        msg_id,
        tombstoned="true",
        tombstoned_at="now64(3)",
        tombstone_reason=f"'{reason}'",
    )


def save_turn(ch: Any, ns: str, agent: str, thread_id: str, msg_id: str) -> None:
    revise_turn(ch, ns, agent, thread_id, msg_id, is_saved="true", saved_at="now64(3)")


async def ok(call: Any, op: str, token: str, **body: Any) -> dict[str, Any]:
    """Call an op through the API and return its JSON answer, asserting a 200."""
    r = await call(op, token, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


SAVE = "conversation.save_message"
SAVE_DEFAULTS = {"user_id": "alice", "conversation_id": "c", "message_id": "m", "role": "user"}


async def append_turn(
    call: Any, token: str, ns: str, agent: str, thread: str, role: str, content: str, **kw: Any
) -> dict[str, Any]:
    """conversation.append of one turn by `agent`, asserted 200."""
    return await ok(
        call,
        "conversation.append",
        token,
        namespace=ns,
        agent=agent,
        thread_id=thread,
        role=role,
        content=content,
        **kw,
    )


async def save(call: Any, token: str, **body: Any) -> dict[str, Any]:
    """conversation.save_message answered 200: alice's message m of conversation c, a
    user turn, unless `body` says otherwise (a field given as None is left out)."""
    fields = {k: v for k, v in {**SAVE_DEFAULTS, **body}.items() if v is not None}
    return await ok(call, SAVE, token, **fields)


def parts_indexed(ch: Any, table: str, ns: str) -> list[bool]:
    """Whether each part holding the namespace's rows of `table` carries its skip indexes
    (a part merged away meanwhile still reads as it was: outdated parts are listed too)."""
    parts = [
        r[0]
        for r in ch.query(
            f"SELECT DISTINCT _part FROM {table} WHERE namespace = {{ns:String}}", parameters={"ns": ns}
        ).result_rows
    ]
    rows = ch.query(
        "SELECT secondary_indices_uncompressed_bytes FROM system.parts WHERE database = currentDatabase() "
        "AND table = {table:String} AND name IN {parts:Array(String)}",
        parameters={"table": table, "parts": parts},
    ).result_rows
    assert len(rows) == len(parts)
    return [r[0] > 0 for r in rows]


@contextlib.contextmanager
def merges_stopped(ch: Any, table: str) -> Iterator[None]:
    """No background merge of `table` (which would build the skip indexes) meanwhile."""
    ch.command(f"SYSTEM STOP MERGES {table}")
    try:
        yield
    finally:
        ch.command(f"SYSTEM START MERGES {table}")
