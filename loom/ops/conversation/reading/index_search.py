"""conversation.search's vector candidates from the read index (loom.read_index).

The index ranks exactly, in memory, what the vector tables hold (live vectors of
recorded turns, newest versions) and says of each candidate whether it may be answered
as held (loom.read_index.state: no change in its thread within the hold, and the index
read the thread after the last one); the others are verified against the engine, as
the engine's own path verifies them. A search is answered from the engine instead,
saying so in ``fallback_reason``, when the index does not answer (INDEX_UNAVAILABLE),
could not catch up with the write events in time (INDEX_BEHIND), or does not hold a
namespace of the search, or holds in it vectors of a model other than the query's
(INDEX_MISSING: those namespaces are read from the engine, the others from the index).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from loom.read_index.client import IndexClient
from loom.store.search import Candidate, Filters

INDEX_PLAN = "read_index"
INDEX_UNAVAILABLE = "read_index_unavailable"
INDEX_BEHIND = "read_index_behind"
INDEX_MISSING = "read_index_missing_namespace"


@dataclass(frozen=True)
class Fetched:
    candidates: list[Candidate]  # best first
    missing: list[str]  # namespaces the index does not hold (yet)


async def fetch(
    client: IndexClient,
    namespaces: tuple[str, ...],
    vector: np.ndarray,
    filters: Filters,
    model: str,
    n: int,
) -> Fetched | str:
    """The index's best `n` candidates of the query's model (only vectors a model made are
    comparable with its query), or why it gave none (a fallback reason)."""
    header = {
        "op": "search",
        "namespaces": list(namespaces),
        "limit": n,
        "filters": {
            "thread_id": filters.thread_id,
            "run_id": filters.run_id,
            "role": filters.role,
            "agent": filters.agent,
            "model": model,
        },
    }
    answer = await client.call(header, vector)
    if answer is None or answer.get("status") not in ("ok", "behind"):
        return INDEX_UNAVAILABLE
    if answer["status"] == "behind":
        return INDEX_BEHIND
    return Fetched(
        [
            Candidate(
                namespace=ns,
                thread_id=th,
                msg_id=mid,
                version=int(ver),
                agent=ag,
                role=role,
                run_id=run,
                user_id=user,
                ts=datetime.fromtimestamp(ts_us / 1_000_000, tz=UTC),
                text=text,
                similarity=float(sim),
                model=model,
                trusted=bool(trusted),
            )
            for ns, th, mid, ver, ag, role, run, user, ts_us, text, sim, trusted in answer["rows"]
        ],
        list(answer.get("missing") or []),
    )
