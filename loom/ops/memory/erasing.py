"""What keeps a memory write from outliving an erasure of its user.

An erasure hides a user's memory with lightweight DELETEs (loom.store.erasure.
hide_user_memory): rows inserted after them would stay readable. A memory write that
runs while its user is being erased (memory.set, memory.set_from_messages' evidence,
an extraction deciding from evidence it read before the DELETE, observe.record, a
profile rebuilt from facts read before the DELETE) could
land after them. So:

* the erasure marks the user in Redis (``memory_erasing``) as ``pending`` before its
  DELETEs and, once they have run, replaces the mark with a version stamped then (D);
* every memory write stamps a version S when it starts (before it reads anything),
  notes what it inserts (ids and versions), and once its inserts are durable reads the
  mark: if it is ``pending``, or D is later than S (the erasure ended after this write
  began, so the write may have read or been told things the erasure removed, and may
  have landed after the DELETEs), it deletes exactly the rows it inserted and answers
  ``reason: "subject_erased"``.

Every write of facts also retires the API processes' cached reads of the user's facts
(loom.ops.memory.scan_cache) once its rows are durable, and again after an undo; the
erasure does after its DELETEs.

Either the write's read of the mark comes after the mark was set (it sees it and undoes
itself), or its inserts were durable before that, so before the DELETEs (which remove
them). A write that starts after the erasure has ended (S later than D) is new memory
and stays. A deferred extraction that runs after the erasure reads no evidence: the
DELETEs removed it.

The mark lives a day (an extraction or a queued job older than that is not expected),
an hour while pending (an erasure that crashed between the two is retried, which sets
it again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from loom import redis_keys
from loom.clock import next_version
from loom.ops.memory import scan_cache
from loom.services import Services
from loom.store import erasure as erasure_store
from loom.store import memories as store
from loom.store.evidence import Evidence
from loom.store.memories import Fact

PENDING = "pending"
PENDING_TTL_S = 3_600
DONE_TTL_S = 86_400
ERASED = "subject_erased"


@dataclass
class Writes:
    """What one memory write inserted for one user, and when it started."""

    namespace: str
    user_id: str
    started: int = field(default_factory=next_version)
    facts: list[tuple[str, int]] = field(default_factory=list)  # (memory_id, version)
    evidence: list[tuple[str, int]] = field(default_factory=list)  # (evidence_id, version)
    extraction_ids: list[str] = field(default_factory=list)
    profiles: list[int] = field(default_factory=list)  # versions of the profile it built

    def add_facts(self, rows: Iterable[Fact]) -> None:
        self.facts += [(r.memory_id, r.version) for r in rows]

    def add_evidence(self, rows: Iterable[Evidence]) -> None:
        self.evidence += [(r.evidence_id, r.version) for r in rows]


async def hide_user(svc: Services, namespace: str, user_id: str) -> dict[str, erasure_store.TableCount]:
    """The erasure's memory step: mark, count, hide every row of the user (the tables
    that hold some), stamp the mark."""
    key = redis_keys.memory_erasing(namespace, user_id)
    await svc.redis.set(key, PENDING, ex=PENDING_TTL_S)
    counts = await svc.run(erasure_store.count_user_memory, svc.ch, namespace, user_id)
    await asyncio.gather(
        *(
            svc.run(erasure_store.hide_user_memory, svc.ch, namespace, user_id, table)
            for table, c in counts.items()
            if c.tombstoned
        )
    )
    await scan_cache.changed(svc, namespace, user_id)  # after the DELETEs
    await svc.redis.set(key, str(next_version()), ex=DONE_TTL_S)
    return counts


async def _outlived(svc: Services, writes: Writes) -> bool:
    raw = await svc.redis.get(redis_keys.memory_erasing(writes.namespace, writes.user_id))
    if raw is None:
        return False
    mark = raw.decode() if isinstance(raw, bytes) else str(raw)
    return mark == PENDING or int(mark) > writes.started


async def settle(svc: Services, writes: Writes) -> bool:
    """Call once the writes are durable. Answers True when an erasure of the user
    outlived them, after deleting exactly the rows they inserted."""
    if not (writes.facts or writes.evidence or writes.extraction_ids or writes.profiles):
        return False
    if writes.facts:  # durable now: cached reads of the user's facts are not current
        await scan_cache.changed(svc, writes.namespace, writes.user_id)
    if not await _outlived(svc, writes):
        return False
    await svc.run(
        store.remove_written,
        svc.ch,
        writes.namespace,
        writes.user_id,
        facts=writes.facts,
        evidence=writes.evidence,
        extraction_ids=writes.extraction_ids,
        profiles=writes.profiles,
    )
    if writes.facts:
        await scan_cache.changed(svc, writes.namespace, writes.user_id)
    return True


__all__ = ["ERASED", "Writes", "hide_user", "settle"]
