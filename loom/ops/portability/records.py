"""How an import batch's records are written, in an order that lets later records rely
on earlier ones: the namespace's settings, then threads, then turns, then the rest.

- Turns go through conversation.append's own write path (embed=False): the recording
  switch, the duplicate check by (thread, msg_id), the sensitivity screen and the
  deletion and erasure fences hold exactly as for an append. A turn that reads as high
  is stored and never embedded; the others are left to the import's background pass.
- Every other kind is written only where the namespace holds no row of its key yet
  (loom.store.portability.KEYS): an import never overwrites what the namespace holds,
  and importing the same file again writes nothing.
- The namespace's settings are applied only to a namespace that has none of its own.
- Memory facts are embedded here, in the API process, as memory.set embeds them (a
  fact that reads as high is stored without a vector); every write of a user's facts
  retires the cached reads of them and yields to an erasure of the user
  (loom.ops.memory.erasing).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, TypeVar

from loom.clock import next_version
from loom.models import portability as lines
from loom.ops.conversation.writing import appending
from loom.ops.memory import erasing
from loom.ops.memory.facts import embed_into, profile_changed
from loom.ops.platform import namespaces as ns_ops
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import briefs as brief_store
from loom.store import conversations as conv_store
from loom.store import evidence as evidence_store
from loom.store import memories as memory_store
from loom.store import portability as store
from loom.store import redaction as redaction_store
from loom.store import threads as thread_store
from loom.store.memories import Fact, Scope

R = TypeVar("R")


@dataclass(frozen=True)
class Target:
    """Where the records go and who writes them."""

    namespace: str
    token_id: str  # the turns' appended_by (the import's token)
    default_ts: datetime  # a turn with no time of its own gets this one (plus its index)


def _sections(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def apply(svc: Services, target: Target, records: Sequence[lines.Record]) -> Counter[str]:
    """Write the batch; answer what it did (see ImportJobOut.counts)."""
    by_kind: dict[str, list[Any]] = {k: [] for k in lines.RECORD_KINDS}
    for r in records:
        by_kind[r.kind].append(r)
    counts: Counter[str] = Counter()
    if by_kind["namespace"]:
        await _namespace(svc, target, by_kind["namespace"][-1], counts)
    await _absent_only(svc, target, "thread", by_kind["thread"], counts, _thread_rows)
    if by_kind["turn"]:
        await _turns(svc, target, by_kind["turn"], counts)
    await _absent_only(svc, target, "redaction", by_kind["redaction"], counts, _redaction_rows)
    await _absent_only(svc, target, "brief", by_kind["brief"], counts, _brief_rows)
    await _absent_only(svc, target, "brief_revision", by_kind["brief_revision"], counts, _revision_rows)
    await _memory(svc, target, by_kind, counts)
    return counts


async def _namespace(svc: Services, target: Target, line: lines.NamespaceLine, counts: Counter[str]) -> None:
    if await svc.run(store.namespace_row_exists, svc.ch, target.namespace):
        counts["namespace_kept"] += 1  # the owner's own settings stay
        return
    await ns_ops._update(
        svc,
        target.namespace,
        conversation_logging_enabled=line.conversation_logging_enabled,
        model_calls_enabled=line.model_calls_enabled,
        extraction_policy=line.extraction_policy,
    )
    counts["namespace"] += 1


async def _turns(svc: Services, target: Target, recs: list[lines.TurnLine], counts: Counter[str]) -> None:
    rows = [
        _row(
            conv_store.Turn,
            r,
            namespace=target.namespace,
            ts=r.ts or target.default_ts + timedelta(microseconds=i),
            metadata=dict(r.metadata),
            high_sensitivity=False,  # an import screens the text again (the exported verdict is not taken)
            appended_by=target.token_id,
            version=next_version(),
        )
        for i, r in enumerate(recs)
    ]
    results = await appending.pipeline(svc).append(rows, embed=False)
    counts["read"] += len(rows)
    for row, res in zip(rows, results, strict=True):
        if not res.stored:
            counts[res.reason or "not_stored"] += 1
            continue
        counts["stored"] += 1
        if row.high_sensitivity:
            counts["high"] += 1  # stored verbatim, never embedded
        if res.embedding == appending.DEFERRED:
            counts["deferred"] += 1


async def _absent_only(
    svc: Services,
    target: Target,
    kind: str,
    recs: Sequence[Any],
    counts: Counter[str],
    build: Any,
) -> None:
    """Write the records of `kind` whose key the namespace holds no row of."""
    if not recs:
        return
    cols = store.KEYS[kind][1]
    unique: dict[tuple[Any, ...], Any] = {}
    for r in recs:
        unique.setdefault(tuple(getattr(r, c) for c in cols), r)
    there = await svc.run(store.present, svc.ch, target.namespace, kind, list(unique))
    new = [r for k, r in unique.items() if store._norm(k) not in there]
    counts[f"{kind}_present"] += len(recs) - len(new)
    if new:
        await build(svc, target, new)
    counts[kind] += len(new)


def _row(cls: type[R], line: Any, **fixed: Any) -> R:
    """The store's row for an import line: the fields they share by name, then `fixed`."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # R is a dataclass; typing has no bound for one
    shared = {k: getattr(line, k) for k in type(line).model_fields if k in names and k not in ("kind", "pos")}
    return cls(**(shared | fixed))


async def _thread_rows(svc: Services, target: Target, recs: list[lines.ThreadLine]) -> None:
    rows = [
        _row(
            thread_store.ThreadRow,
            r,
            namespace=target.namespace,
            metadata=dict(r.metadata),
            created_at=r.created_at or target.default_ts,
            version=next_version(),
        )
        for r in recs
    ]
    await svc.run(thread_store.insert, svc.ch, rows)


async def _redaction_rows(svc: Services, target: Target, recs: list[lines.RedactionLine]) -> None:
    rows = [_row(redaction_store.Record, r, namespace=target.namespace) for r in recs]
    await svc.run(redaction_store.RECORDS.insert, svc.ch, rows)


async def _brief_rows(svc: Services, target: Target, recs: list[lines.BriefLine]) -> None:
    rows = [
        _row(brief_store.BriefRow, r, namespace=target.namespace, sections=_sections(r.sections))
        for r in recs
    ]
    await svc.run(brief_store.BRIEFS.insert, svc.ch, rows, version=next_version())


async def _revision_rows(svc: Services, target: Target, recs: list[lines.BriefRevisionLine]) -> None:
    rows = [
        _row(brief_store.RevisionRow, r, namespace=target.namespace, sections=_sections(r.sections))
        for r in recs
    ]
    await svc.run(brief_store.REVISIONS.insert, svc.ch, rows, version=next_version())


# -- memory ------------------------------------------------------------------------------


async def _memory(svc: Services, target: Target, by_kind: dict[str, list[Any]], counts: Counter[str]) -> None:
    """Facts, evidence and decisions, per user (each user's writes yield to an erasure of
    that user, and retire the cached reads of the user's facts)."""
    users = sorted({r.user_id for k in ("memory", "memory_evidence", "memory_decision") for r in by_kind[k]})
    for user in users:
        writes = erasing.Writes(target.namespace, user)

        async def facts(
            svc: Services, t: Target, recs: list[lines.MemoryLine], w: erasing.Writes = writes
        ) -> None:
            rows = [_fact(t, r) for r in recs]
            live = [f for f in rows if not f.tombstoned and not reads_as_high(f.text)]
            await embed_into(svc, live)  # the API's embedder, as memory.set's; never high text
            await svc.run(memory_store.insert, svc.ch, rows)
            w.add_facts(rows)

        async def evidence(
            svc: Services, t: Target, recs: list[lines.EvidenceLine], w: erasing.Writes = writes
        ) -> None:
            rows = [_evidence(t, r) for r in recs]
            await svc.run(evidence_store.insert, svc.ch, rows)
            w.add_evidence(rows)

        mine = {
            k: [r for r in by_kind[k] if r.user_id == user]
            for k in ("memory", "memory_evidence", "memory_decision")
        }
        await _absent_only(svc, target, "memory", mine["memory"], counts, facts)
        await _absent_only(svc, target, "memory_evidence", mine["memory_evidence"], counts, evidence)
        await _absent_only(svc, target, "memory_decision", mine["memory_decision"], counts, _decision_rows)
        if await erasing.settle(svc, writes):
            counts["memory_erased"] += len(writes.facts) + len(writes.evidence)
        elif writes.facts:
            await profile_changed(svc, Scope(target.namespace, user))


def _fact(t: Target, r: lines.MemoryLine) -> Fact:
    return _row(
        Fact,
        r,
        namespace=t.namespace,
        kind=r.fact_kind,
        evidence_ids=list(r.evidence_ids),
        valid_from=r.valid_from or r.created_at,
        version=next_version(),
    )


def _evidence(t: Target, r: lines.EvidenceLine) -> evidence_store.Evidence:
    # Evidence that reads as high keeps its place but no text, as an extraction keeps it.
    high = r.high_sensitivity or reads_as_high(r.content)
    return _row(
        evidence_store.Evidence,
        r,
        namespace=t.namespace,
        content="" if high else r.content,
        high_sensitivity=high,
        version=next_version(),
    )


async def _decision_rows(svc: Services, target: Target, recs: list[lines.DecisionLine]) -> None:
    rows = [
        _row(memory_store.DecisionRow, r, namespace=target.namespace, evidence_ids=list(r.evidence_ids))
        for r in recs
    ]
    await svc.run(memory_store.DECISIONS.insert, svc.ch, rows)
