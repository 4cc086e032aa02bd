"""SQL of the read index's rebuilds (loom.read_index.state): a namespace's (or one
thread's) newest embedding rows, as the index keeps them.

Read from conversation_embeddings FINAL (the truth), not the vector tables: those may
still hold a version whose newer one was tombstoned. Only live vectors of recorded turns
carry their vector and text; the other rows come as versions, so the index knows a key
was removed at that version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom.read_index.feed import Row
from loom.store.rows import named

_LIVE = "NOT tombstoned AND error = '' AND origin = 'recorded' AND embedding.size0 > 0"

_ROWS = f"""
SELECT thread_id, msg_id, version, toString(agent) AS ag, toString(role) AS role_name, run_id, user_id,
       toUnixTimestamp64Micro(ts) AS ts_us, model,
       if({_LIVE}, text, '') AS kept_text,
       if({_LIVE}, reinterpret(embedding, 'String'), '') AS vec
FROM conversation_embeddings FINAL
WHERE namespace = {{ns:String}} {{thread}}
"""


def namespaces(ch: Client) -> dict[str, int]:
    """Every namespace with embedding rows, and about how many (versions counted)."""
    rows = ch.query(
        "SELECT toString(namespace) AS ns, count() AS n FROM conversation_embeddings GROUP BY namespace"
    )
    return {r["ns"]: int(r["n"]) for r in named(rows)}


def rows(ch: Client, namespace: str, thread_id: str | None = None) -> list[Row]:
    """The newest embedding row of every turn of the namespace (or of one thread)."""
    params: dict[str, str] = {"ns": namespace}
    where = ""
    if thread_id is not None:
        where = "AND thread_id = {th:String}"
        params["th"] = thread_id
    result = ch.query(_ROWS.replace("{thread}", where), parameters=params, column_formats={"vec": "bytes"})
    return list(_decoded(result.named_results(), namespace))


def _decoded(found: Iterator[dict[str, Any]], namespace: str) -> Iterator[Row]:
    for r in found:
        raw = r["vec"]
        vec = np.frombuffer(raw, dtype="<f4") if isinstance(raw, bytes) and raw else None
        yield Row(
            namespace=namespace,
            thread_id=str(r["thread_id"]),
            msg_id=str(r["msg_id"]),
            version=int(r["version"]),
            agent=str(r["ag"]),
            role=str(r["role_name"]),
            run_id=str(r["run_id"]),
            user_id=str(r["user_id"]),
            ts_us=int(r["ts_us"]),
            text=str(r["kept_text"]),
            model=str(r["model"]),
            vector=vec,
        )
