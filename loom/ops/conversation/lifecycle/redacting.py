"""conversation.redact (admin): replace spans of one turn with a placeholder, keeping the
turn in place (same msg_id, ts, role, owner), and make the old text leave the disk.

The spans, in the turn's text (``content``; offsets count Unicode code points):
- ``spans``: exact texts, every occurrence of each (one that does not occur replaces
  nothing: asked again after a redaction, the op finds nothing left and answers
  ``redacted: false``);
- ``ranges``: ``[start, end)`` character ranges, within the text (else 422 naming the
  range);
- ``high: true``: every span that reads as high (loom.sensitivity.high_spans).
Overlapping spans merge; each merged span becomes one placeholder (default
``[redacted]``, 1 to 64 characters, which must not itself read as high). The same
removed texts are replaced wherever the turn was copied: its reasoning, the memory
evidence kept of it, and the thread's title.

The new text is screened again: no longer reading as high, the turn's high mark is
cleared and it is embedded again (a user or assistant turn, or a summary; in the API
process, as a saved message is); still high, it keeps the mark and gets no embedding.
An embedding row another agent's live copy with the old text shares passes to that
copy instead (conversation.delete's hand-over). A summary built from the turn is
tombstoned and the turns it replaced come back (the next compaction summarises them
again); the redacted turn, if compacted, comes back too. Every older version of every
row that held the old text is removed from disk before the answer
(loom.ops.conversation.lifecycle.message_removal), and the redaction is recorded (when, by which
token, the placeholder, how many spans: never the removed text) for erasure.export.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC

from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Forbidden, InvalidRequest
from loom.models.conversation.lifecycle import RedactRequest
from loom.ops.conversation.lifecycle import message_removal as mr
from loom.sensitivity import high_spans, reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import redaction as store

PLACEHOLDER = "[redacted]"
PLACEHOLDER_MAX = 64
COMPACTED = "compacted"

Span = tuple[int, int]


def _check(
    spans: Sequence[str] | None, ranges: Sequence[Sequence[int]] | None, high: bool, placeholder: str
) -> None:
    if not spans and not ranges and not high:
        raise InvalidRequest(
            "name what to redact: spans, ranges or high: true", field="spans", rule="one_of_spans_ranges_high"
        )
    if not placeholder or len(placeholder) > PLACEHOLDER_MAX:
        raise InvalidRequest(
            f"placeholder must be 1 to {PLACEHOLDER_MAX} characters", field="placeholder", rule="length"
        )
    if reads_as_high(placeholder):
        raise InvalidRequest("placeholder must not read as high", field="placeholder", rule="not_high")
    for i, s in enumerate(spans or []):
        if not s:
            raise InvalidRequest("a span must not be empty", field=f"spans.{i}", rule="non_empty")
        if placeholder in s or s in placeholder:
            # the placeholder would hold the span again (or the span would match placeholders)
            raise InvalidRequest(
                "a span must not contain or be part of the placeholder",
                field=f"spans.{i}",
                rule="not_placeholder",
            )


def locate(content: str, spans: Sequence[str], ranges: Sequence[Sequence[int]], high: bool) -> list[Span]:
    """The merged spans to replace, in order (422 for a range outside the text)."""
    found: list[Span] = []
    for s in spans:
        at = content.find(s)
        while at >= 0:
            found.append((at, at + len(s)))
            at = content.find(s, at + len(s))
    for i, r in enumerate(ranges):
        a, b = int(r[0]), int(r[1])
        if not 0 <= a < b <= len(content):
            raise InvalidRequest(
                f"ranges[{i}] must satisfy 0 <= start < end <= {len(content)} (the text's length)",
                field=f"ranges.{i}",
                rule="within_text",
            )
        found.append((a, b))
    if high:
        found += high_spans(content)
    merged: list[Span] = []
    for a, b in sorted(found):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def splice(content: str, spans: Sequence[Span], placeholder: str) -> str:
    out, at = [], 0
    for a, b in spans:
        out += [content[at:a], placeholder]
        at = b
    out.append(content[at:])
    return "".join(out)


class Replacer:
    """Replaces the removed texts (longest first) in a copy of the turn's text."""

    def __init__(self, removed: Sequence[str], placeholder: str) -> None:
        self.removed = sorted({r for r in removed if r}, key=len, reverse=True)
        self.placeholder = placeholder

    def __call__(self, text: str) -> str | None:
        """The text with every removed span replaced; None when it holds none."""
        if not any(r in text for r in self.removed):
            return None
        for r in self.removed:
            text = text.replace(r, self.placeholder)
        return text


async def redact(svc: Services, who: Principal, ask: RedactRequest) -> mr.Receipt:
    """conversation.redact (admin)."""
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot redact", rule="read_scope")
    ns = who.namespace(ask.namespace)
    agent, thread_id, msg_id, placeholder = ask.agent, ask.thread_id, ask.msg_id, ask.placeholder
    _check(ask.spans, ask.ranges, ask.high, placeholder)
    receipt = mr.Receipt(
        namespace=ns,
        agent=agent,
        thread_id=thread_id,
        msg_id=msg_id,
        action=store.REDACTED,
        placeholder=placeholder,
        by=who.token_id,
    )
    while True:
        async with mr.guarded(svc, ns, thread_id) as window:
            v, snap, t = await mr.snapshot_of_turn(svc, ns, agent, thread_id, msg_id)
            if not _vector_on_its_way(svc, t, snap.emb):
                located = locate(t.content, ask.spans or [], ask.ranges or [], ask.high)
                receipt.high_sensitivity = t.high_sensitivity
                if not located:
                    return receipt
                removals = await _redact(svc, window, snap, t, v, located, receipt)
                break
        # Rare (a turn appended moments ago): its vector is written under the lease, so
        # it is waited for with the lease released, and the snapshot is taken again.
        await _embedding_settled(svc, ns, agent, thread_id, msg_id)
    # Outside the lease and the change window: what is readable no longer changes (only
    # versions below the ones just written go), and a long rewrite holds up no writer.
    await svc.run(mr.record, svc, receipt, t.user_id)
    await mr.remove_from_disk(svc, receipt, removals)
    return receipt


def _write_deadline(svc: Services, t: conv_store.Turn) -> float:
    """After this time the worker writes no vector for the turn (the recovery pass embeds
    its current text instead)."""
    return t.ts.replace(tzinfo=t.ts.tzinfo or UTC).timestamp() + svc.settings.recovery_grace_seconds


def _vector_on_its_way(svc: Services, t: conv_store.Turn, row: emb_store.EmbeddingRow | None) -> bool:
    """The old text's own embedding may still land: the worker writes a turn's vector
    under the thread lease after checking only that the turn is live, so a vector of the
    old text written after the redaction would bring the text back. That is a turn that
    may be embedded, has no embedding row yet (a failed embed writes one too) and whose
    write deadline has not passed."""
    return row is None and mr.embeddable(t) and time.time() < _write_deadline(svc, t)


async def _embedding_settled(svc: Services, ns: str, agent: str, thread_id: str, msg_id: str) -> None:
    """Wait (bounded by the worker's write deadline) until the turn's vector is no longer
    on its way (:func:`_vector_on_its_way`), outside the thread lease the worker needs."""
    t, row = await asyncio.gather(
        svc.run(store.turn, svc.ch, ns, agent, thread_id, msg_id),
        svc.run(emb_store.get, svc.ch, ns, thread_id, msg_id, vectors=False),
    )
    if t is None or not _vector_on_its_way(svc, t, row):
        return
    deadline = _write_deadline(svc, t)
    while time.time() < deadline:
        if await svc.run(emb_store.get, svc.ch, ns, thread_id, msg_id, vectors=False) is not None:
            return
        await asyncio.sleep(0.05)


async def _redact(
    svc: Services,
    window: mr.Window,
    snap: mr.Snapshot,
    t: conv_store.Turn,
    v: int,
    located: list[Span],
    receipt: mr.Receipt,
) -> list[store.Removal]:
    placeholder = receipt.placeholder
    change = Replacer([t.content[a:b] for a, b in located], placeholder)
    content = splice(t.content, located, placeholder)
    at = utcnow()
    rc = await svc.run(mr.recompaction, svc, snap, v) if snap.summaries else mr.Recompaction()
    back = bool(rc.summaries) and t.tombstoned and t.tombstone_reason == COMPACTED
    still_high = reads_as_high(content)
    new = replace(
        t,
        content=content,
        reasoning=change(t.reasoning) or t.reasoning,
        high_sensitivity=still_high,
        tombstoned=t.tombstoned and not back,
        tombstoned_at=None if back else t.tombstoned_at,
        tombstone_reason="" if back else t.tombstone_reason,
        version=v,
    )
    evidence = snap.evidence.holding(t.user_id, t.content)
    new_evidence = mr.rewrite_evidence(evidence, change, v)
    title = change(snap.thread.title) if snap.thread is not None else None
    threads = [] if snap.thread is None or title is None else [replace(snap.thread, title=title, version=v)]
    rows = await _embeddings(svc, snap, t, new, rc, receipt)
    mine = {r.msg_id: r for r in rows}
    removals = await mr.older_versions(
        svc,
        snap,
        t,
        v,
        mine,
        evidence=new_evidence,
        evidence_docs=evidence.all_docs() if new_evidence else [],
        summaries=rc.summaries,
        thread_below=v if threads else 0,
    )
    writes = mr.Writes(turn=new, rc=rc, embeddings=rows, evidence=new_evidence, threads=threads)
    await mr.write(svc, window, receipt, removals, writes)
    receipt.spans, receipt.high_sensitivity = len(located), still_high
    receipt.done = True
    receipt.at = at
    return removals


async def _embeddings(
    svc: Services,
    snap: mr.Snapshot,
    old: conv_store.Turn,
    new: conv_store.Turn,
    rc: mr.Recompaction,
    receipt: mr.Receipt,
) -> list[emb_store.EmbeddingRow]:
    """The embedding rows to write: the old text's row settled (and the summaries'), the
    new text and the restored turns embedded."""
    others = mr.live_row_of_other(snap, old)
    retired = {old.agent: [*([] if others else [old.msg_id]), *(s.msg_id for s in rc.summaries)]}
    handed, tombs = await svc.run(mr.settle_turns, svc, snap, retired)
    is_handed = old.msg_id in {r.msg_id for r in handed}
    todo = [r for r in rc.restored if not mr.live_row_of_other(snap, r)]
    if not others and not is_handed:
        todo.append(new)
    fresh = await mr.embed_rows(svc, todo)
    fresh_ids = {r.msg_id for r in fresh}
    rows = [*handed, *(r for r in tombs if r.msg_id not in fresh_ids), *fresh]
    mine = {r.msg_id: r for r in rows}.get(old.msg_id)
    receipt.embedding = (
        "kept_by_other_agent"
        if others
        else "handed_over"
        if is_handed
        else "none"
        if mine is None
        else "tombstoned"
        if mine.tombstoned
        else "failed"
        if mine.error
        else "embedded"
    )
    return rows


__all__ = ["PLACEHOLDER", "PLACEHOLDER_MAX", "high_spans", "locate", "redact", "splice"]
