"""SQL of conversation.compact: reading one agent's thread whole (the window is chosen
from it; the retirement writes the summary and the replaced turns' tombstoned versions
through loom.store.conversations.insert).

The rules (which turns a summary replaces, how shared embedding rows are settled) are
the op's (loom.ops.conversation.compacting).
"""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from loom.store import conversations as conv_store

_THREAD_WHERE = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String}"
_COLUMNS = ", ".join(
    f"toString({c}) AS {c}" if c in ("namespace", "agent", "role", "origin") else c
    for c in conv_store.COLUMNS
)


def live_turns(ch: Client, namespace: str, agent: str, thread_id: str) -> list[conv_store.Turn]:
    """The thread's live recorded turns, oldest first ((ts, msg_id) order)."""
    rows = ch.query(
        f"SELECT {_COLUMNS} FROM conversations FINAL WHERE {_THREAD_WHERE} AND NOT tombstoned "
        f"AND {conv_store.IS_RECORDED} ORDER BY ts, msg_id",
        parameters={"ns": namespace, "ag": agent, "th": thread_id},
    ).named_results()
    out = []
    for r in rows:
        r["metadata"] = conv_store._metadata(r["metadata"])
        for flag in ("high_sensitivity", "is_summary", "is_saved", "tombstoned"):
            r[flag] = bool(r[flag])
        out.append(conv_store.Turn(**r))
    return out
