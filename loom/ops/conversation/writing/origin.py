"""A saved-only turn becomes recorded when it is appended while the namespace records.

conversation.save_message stores a message the transcript does not hold as a
saved-only row (``origin`` "saved", migration 007): it belongs to the user who saved
it. An append of the same turn (same agent, thread and msg_id) is a duplicate and
writes no second row; when its namespace records, it makes that row part of the
transcript instead: a new version of the row with ``origin`` "recorded", and one of the
embedding row serving it, so that its vector reaches conversation.search's vector
tables. Written under the thread lease shared with save and unsave (an unsave that
removed the row first wins: the append then answers ``deleted``), inside
``search_marks.changing`` since it rewrites existing rows. Running it again changes
nothing (only a live saved-only row is revised).

The append's flush names the turns to look at (loom.ops.conversation.writing.appending): a
duplicate whose newest row it read as saved-only, or whose claim a save holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace

from loom.clock import next_version
from loom.errors import Unavailable
from loom.leases import LeaseTimeout, thread_lease
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import saved as saved_store
from loom.store import search_marks
from loom.store.keys import TurnKey


async def record_saved(svc: Services, keys: Sequence[TurnKey]) -> set[TurnKey]:
    """Make the named saved-only rows recorded. Returns the keys whose row is gone (an
    unsave removed it before the lease was ours)."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return set()
    # Most such turns are recorded already (a save's claim outlives its row's upgrade):
    # a read without the lease settles them.
    now = await svc.run(conv_store.states, svc.ch, keys)
    todo = [
        k for k in keys if k not in now or (now[k].origin == conv_store.SAVED_ONLY and not now[k].tombstoned)
    ]
    by_thread: dict[tuple[str, str], list[TurnKey]] = {}
    for k in todo:
        by_thread.setdefault((k[0], k[2]), []).append(k)
    gone: set[TurnKey] = set()
    for (ns, thread_id), group in by_thread.items():
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(thread_lease(svc.redis, ns, thread_id))
            except LeaseTimeout:
                raise Unavailable(
                    "the conversation is busy with another write; retry the append",
                    field="thread_id",
                    rule="retry",
                ) from None
            await stack.enter_async_context(
                search_marks.changing(svc.redis, svc.ch, svc.run, [(ns, thread_id)])
            )
            gone |= await svc.run(_record_sync, svc, group)
    return gone


def _record_sync(svc: Services, keys: list[TurnKey]) -> set[TurnKey]:
    gone: set[TurnKey] = set()
    for key in keys:
        row = saved_store.transcript_row(svc.ch, key)
        if row is None:
            gone.add(key)
            continue
        if not row.saved_only or row.tombstoned:
            continue
        saved_store.record(svc.ch, key, next_version())
        emb = emb_store.get(svc.ch, key[0], key[2], key[3])
        if emb is not None and emb.agent == key[1] and emb.origin != conv_store.RECORDED:
            emb_store.insert(svc.ch, [replace(emb, origin=conv_store.RECORDED, version=next_version())])
    return gone


__all__ = ["record_saved"]
