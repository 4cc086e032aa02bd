"""What conversation.delete_message and conversation.redact share: the guard they run
under, the embedding rows they settle or rebuild, the derived copies they rewrite, the
compaction rule, the removal of older row versions from disk, and the receipt.

Rules (stated once here, for both ops):

- Guard. The reads and writes run under the thread lease (save, unsave, append's
  embedding write, compaction and conversation.delete share it) and inside search's
  change window (loom.store.search_marks.changing), so conversation.search never serves
  the old text. The removal of older versions from disk runs after both are released:
  it changes nothing readable, and a long rewrite then holds up no writer.
- Embedding row. The turn's row passes to another agent's live copy with the same text
  when there is one, or is tombstoned, exactly as conversation.delete settles a row
  (loom.ops.conversation.lifecycle.deleting: the hand-over and the 240-character rule). A turn that
  stays live with a new text (a redaction) gets a new row built from that text when it
  no longer reads as high (a user or assistant turn, or a summary), embedded in the API
  process as a saved message is; still high, it gets none.
- Derived copies. The saved-message index (saved_docs, its postings in saved_terms and
  the per-user vectors in saved_vectors) and the vector tables follow the new versions
  through their views; their rows of the older versions are removed. Memory evidence
  an extraction kept of the turn (the same message id, and the turn's owner or its very
  text) is tombstoned (a deletion) or rewritten with the same spans replaced (a
  redaction), with its postings.
- Compaction. A live summary of the agent's thread whose ``compacted_from`` lists the
  turn was built from the old text, so it is tombstoned (reason ``recompact``, text
  emptied, its embedding row settled) and the turns it replaced are live again (each
  re-embedded when it may be): the thread is back to its turns, and the next
  conversation.compact summarises them again from their current text. The turn itself
  stays deleted (a deletion) or comes back redacted (a redaction).
- Unreadable, then gone from disk. Once the new versions are written (the turn's, its
  embedding row's, the evidence's, the summary's), no op reads the old text: every read
  takes a row's newest version (FINAL), and the indexes' reads (vector tables, saved
  postings, evidence postings) check each row against it; the receipt's
  ``unreadable_ms`` is that moment. Then every version older than the one just written,
  of every row named above (the turn and its saved_docs copy, its postings by document
  id, its embedding row with the vector tables' and saved_vectors' copies, the summary's
  rows, the evidence and its postings, a thread row whose title held a removed span), is
  removed by one mutation per table that rewrites the parts holding it. The op waits
  for the mutations (``gone_ms``, ``removal: done``: no older version of the text is
  left in a part, FINAL or not), at most GONE_WAIT_S (30 s): a mutation is durable once
  submitted, so one still running then (a large part to rewrite, or the engine's merges
  ahead of it) finishes on its own and the receipt says ``removal: pending``. The
  engine drops the replaced parts' files after its usual delay (old_parts_lifetime), as
  for every mutation. The removal record (message_redactions) is written before the
  wait.
- The answer is a receipt: per table, the rows written and the rows removed from disk;
  when, by which token; never any removed text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from loom import logging as loom_logging
from loom.clock import next_version, utcnow
from loom.errors import NotFound, Unavailable
from loom.leases import LeaseTimeout, thread_lease
from loom.ops.conversation.common import (
    EMBED_CHARS,
    EMBEDDED_ROLES,
    KEPT,
    SPEAKER,
    TURN_KEY,
    embed_text,
    model_text,
    picked,
)
from loom.ops.conversation.lifecycle.deleting import ThreadState, settle_writes, with_vectors
from loom.ops.embedding import inline
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import deletion, search_marks
from loom.store import embeddings as emb_store
from loom.store import evidence as evidence_store
from loom.store import redaction as store
from loom.store import threads as thread_store
from loom.store.transcript_postings import speaker_of

log = loom_logging.get("loom.conversation.message_removal")

RECOMPACT = "recompact"  # the tombstone_reason of a summary built from a removed text
COMPACTED = "compacted"


@dataclass
class TableCount:
    """One table's line of a receipt."""

    written: int = 0  # new row versions written (tombstones, rewritten texts, hand-overs)
    removed: int = 0  # older row versions removed from disk


@dataclass(kw_only=True)
class Receipt:
    """What a removal did: per table, rows written and removed from disk; when, by whom."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    action: str  # deleted | redacted | unsaved
    found: bool = True
    done: bool = False  # False: nothing was left to do (asked again)
    tables: dict[str, TableCount] = field(default_factory=dict)
    embedding: str = "none"  # what became of the turn's embedding row
    summaries_tombstoned: int = 0
    turns_restored: int = 0
    placeholder: str = ""
    spans: int = 0
    high_sensitivity: bool = False  # the turn reads as high after a redaction
    unsaved: bool = False  # an end-user token's delete withdrew its saved message
    at: datetime | None = None
    by: str = ""  # the token id
    # Milliseconds from the op's start until no op could read the old text (its newer
    # versions written: every read takes the newest version, or checks an index's row
    # against it), and until no part file held it (0 when nothing was removed).
    unreadable_ms: float = 0.0
    gone_ms: float = 0.0
    # done: the older versions left the disk before the answer; pending: their removal
    # was submitted and the engine finishes it (it took longer than the op waits).
    removal: str = "done"
    started: float = field(default_factory=time.perf_counter, repr=False)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 1)

    def wrote(self, table: str, n: int = 1) -> None:
        self.tables.setdefault(table, TableCount()).written += n

    def removed(self, counts: dict[str, int]) -> None:
        """Older rows on disk per table, counted before and after the op's writes: the
        larger count stands (a merge may take some between; a row may land)."""
        for table, n in counts.items():
            count = self.tables.setdefault(table, TableCount())
            count.removed = max(count.removed, n)


class Window:
    """Search's change window around a removal's writes: its first raise of the marks
    runs beside the removal's reads (which need no window) and must be done before the
    first write (:meth:`open`)."""

    def __init__(self, first: asyncio.Future[None]) -> None:
        self._first = first

    async def open(self) -> None:
        await self._first


@contextlib.asynccontextmanager
async def guarded(svc: Services, namespace: str, thread_id: str) -> AsyncIterator[Window]:
    """The thread lease, and search's change window (its marks raised before the writes
    and again after the block, also when it fails: part of its writes may have landed)."""
    pairs = [(namespace, thread_id)]
    try:
        async with thread_lease(svc.redis, namespace, thread_id, wait_s=30.0):
            first = asyncio.ensure_future(search_marks.raise_marks(svc.redis, svc.ch, svc.run, pairs))
            try:
                yield Window(first)
            finally:
                try:
                    await first
                finally:
                    await search_marks.raise_marks(svc.redis, svc.ch, svc.run, pairs)
    except LeaseTimeout:
        raise Unavailable(
            "the conversation is busy with another write; retry", field="thread_id", rule="retry"
        ) from None


# -- what a removal reads first ------------------------------------------------------


@dataclass
class Snapshot:
    """Everything a removal reads before it writes, read side by side (one round of
    reads on the way to the answer)."""

    turn: conv_store.Turn | None
    summaries: list[conv_store.Turn]  # live summaries listing the turn
    saved_docs: list[int]  # the saved index's document ids of the turn's older versions
    evidence: store.EvidenceCopies  # memory evidence of the message id (any user)
    thread: thread_store.ThreadRow | None
    copies: dict[str, dict[str, deletion.Copy]]  # every agent's copy of every turn of the thread
    rows: list[emb_store.EmbeddingRow]  # the thread's live embedding rows, without vectors
    emb: emb_store.EmbeddingRow | None  # the turn's embedding row, newest version, any state, no vector


async def snapshot_of_turn(
    svc: Services, ns: str, agent: str, thread_id: str, msg_id: str
) -> tuple[int, Snapshot, conv_store.Turn]:
    """The version a removal writes and its snapshot below it, of a turn that must
    exist (404 else)."""
    v = next_version()
    snap = await snapshot(svc, ns, agent, thread_id, msg_id, v)
    if snap.turn is None:
        raise NotFound(f"no message {msg_id!r} in this thread", field="msg_id", rule="exists")
    return v, snap, snap.turn


async def snapshot(svc: Services, ns: str, agent: str, thread_id: str, msg_id: str, below: int) -> Snapshot:
    ch = svc.ch
    # Two groups, because asyncio.gather's types stop at six awaitables; all eight run at once.
    (turn, summaries, docs, evidence), (thread, copies, rows, emb) = await asyncio.gather(
        asyncio.gather(
            svc.run(store.turn, ch, ns, agent, thread_id, msg_id),
            svc.run(store.summaries_of, ch, ns, agent, thread_id, msg_id),
            svc.run(store.saved_docs, ch, ns, agent, thread_id, msg_id, below),
            svc.run(store.evidence_of, ch, ns, msg_id),
        ),
        asyncio.gather(
            svc.run(thread_store.get, ch, ns, agent, thread_id),
            svc.run(deletion.copies, ch, ns, thread_id, EMBED_CHARS),
            svc.run(deletion.thread_embeddings, ch, ns, thread_id, vectors=False),
            svc.run(emb_store.get, ch, ns, thread_id, msg_id, vectors=False),
        ),
    )
    return Snapshot(turn, summaries, docs, evidence, thread, copies, rows, emb)


# -- embedding rows ---------------------------------------------------------------


def embeddable(t: conv_store.Turn) -> bool:
    """A live turn search indexes and the embedder may see."""
    return (
        not t.tombstoned
        and (t.role in EMBEDDED_ROLES or t.is_summary)
        and not t.high_sensitivity
        and not reads_as_high(t.content)
    )


def settle_turns(
    svc: Services, snap: Snapshot, retired: Mapping[str, Sequence[str]]
) -> tuple[list[emb_store.EmbeddingRow], list[emb_store.EmbeddingRow]]:
    """The embedding rows of the named turns (agent -> msg_ids) whose copy no longer holds
    their text: passed to another agent's live copy with that text, or tombstoned
    (conversation.delete's rules). Returns (hand-overs, tombstones), not yet written."""
    wanted = {m for ids in retired.values() for m in ids}
    copies = {m: dict(c) for m, c in snap.copies.items() if m in wanted}
    state = ThreadState(copies, [r for r in snap.rows if r.msg_id in wanted])
    for agent, ids in retired.items():
        state.retired(agent, ids)
    writes, _ = settle_writes(state)
    writes = with_vectors(svc, writes)
    return [w for w in writes if not w.tombstoned], [w for w in writes if w.tombstoned]


def live_row_of_other(snap: Snapshot, t: conv_store.Turn) -> bool:
    """The turn's embedding row serves another agent's live copy (leave it be)."""
    return any(r.msg_id == t.msg_id and r.agent != t.agent for r in snap.rows)


async def embed_rows(svc: Services, turns: Sequence[conv_store.Turn]) -> list[emb_store.EmbeddingRow]:
    """New embedding rows for live turns that may be embedded (screened: none that reads
    as high reaches the embedder). A failed embed writes the row with its safe error
    (fail-open, as a save does)."""
    todo = [t for t in turns if embeddable(t)]
    if not todo:
        return []
    prefix = svc.settings.embed_speaker_prefix
    texts = [
        model_text(embed_text(t.content), t.role, t.is_summary, prefix, speaker_of(t.metadata)) for t in todo
    ]
    got = await inline.embed(svc, texts)
    out = []
    for i, t in enumerate(todo):
        out.append(
            emb_store.EmbeddingRow(
                **picked(t, *TURN_KEY, *SPEAKER, "ts", "is_summary", *KEPT),
                text=embed_text(t.content),  # the kept text, never the model's prefixed input
                embedding=got.vectors[i] if got.ok and got.vectors is not None else [],
                model=got.model_id if got.ok else "",
                error="" if got.ok else got.error,
                tombstoned=False,
                version=next_version(),
            )
        )
    return out


async def embedding_bound(
    svc: Services, snap: Snapshot, t: conv_store.Turn, written: dict[str, emb_store.EmbeddingRow]
) -> int:
    """The version below which the turn's embedding row's versions go from disk: the one
    just written, or a tombstone written before; 0 (none go) when the row serves another
    agent's live copy this removal did not touch."""
    if t.msg_id in written:
        return written[t.msg_id].version
    if snap.turn is not None and t.msg_id == snap.turn.msg_id:
        row = snap.emb
    else:
        row = await svc.run(emb_store.get, svc.ch, t.namespace, t.thread_id, t.msg_id, vectors=False)
    if row is None or (not row.tombstoned and row.agent != t.agent):
        return 0
    return row.version


# -- the compaction rule -----------------------------------------------------------


@dataclass
class Recompaction:
    """The summaries listing the turn, tombstoned, and the turns they replaced, restored
    (newest versions to write)."""

    summaries: list[conv_store.Turn] = field(default_factory=list)
    restored: list[conv_store.Turn] = field(default_factory=list)


def recompaction(svc: Services, snap: Snapshot, version: int) -> Recompaction:
    """Tombstoned versions of the live summaries listing the turn, and live versions of
    the turns they replaced (every one but the turn itself, which the op writes)."""
    t = snap.turn
    if t is None or not snap.summaries:
        return Recompaction()
    at = utcnow()
    out = Recompaction()
    replaced: list[str] = []
    for s in snap.summaries:
        out.summaries.append(
            replace(
                s,
                content="",
                reasoning="",
                tombstoned=True,
                tombstoned_at=at,
                tombstone_reason=RECOMPACT,
                version=version,
            )
        )
        ids = s.metadata.get("compacted_from")
        replaced += [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
    others = [i for i in dict.fromkeys(replaced) if i != t.msg_id]
    for r in store.turns(svc.ch, t.namespace, t.agent, t.thread_id, others):
        if r.tombstoned and r.tombstone_reason == COMPACTED:
            out.restored.append(
                replace(r, tombstoned=False, tombstoned_at=None, tombstone_reason="", version=version)
            )
    return out


# -- derived copies ----------------------------------------------------------------


def rewrite_evidence(
    copies: store.EvidenceCopies, change: Any, version: int
) -> list[evidence_store.Evidence]:
    """New versions of the evidence rows `change(content)` alters (None: leave it). A
    row whose new text reads as high keeps none (as memory evidence is stored)."""
    out = []
    for e in copies.rows:
        new = change(e.content)
        if new is None:
            continue
        high = bool(new) and reads_as_high(new)
        content = "" if high else new
        tombstoned = e.tombstoned or not new
        if (content, tombstoned) == (e.content, e.tombstoned):
            continue
        out.append(replace(e, content=content, high_sensitivity=high, tombstoned=tombstoned, version=version))
    return out


def removals_of(
    t: conv_store.Turn,
    version: int,
    *,
    saved_docs: Sequence[int],
    emb_below: int,
    evidence: Sequence[evidence_store.Evidence],
    evidence_docs: Sequence[int],
    summaries: Sequence[conv_store.Turn],
    summary_emb_below: dict[str, int],
    thread_below: int = 0,
) -> list[store.Removal]:
    """Every older version a removal takes from disk (see the module's rules)."""
    out = store.turn_versions(t.namespace, t.agent, t.thread_id, t.msg_id, version)
    out += store.postings("saved_terms", t.namespace, saved_docs)
    if emb_below:
        out += store.embedding_versions(t.namespace, t.thread_id, t.msg_id, emb_below)
    out += store.evidence_versions(t.namespace, [(e.user_id, e.evidence_id, e.version) for e in evidence])
    if evidence:
        out += store.postings("evidence_terms", t.namespace, evidence_docs)
    for s in summaries:
        out += store.turn_versions(s.namespace, s.agent, s.thread_id, s.msg_id, s.version)
        below = summary_emb_below.get(s.msg_id, 0)
        if below:
            out += store.embedding_versions(s.namespace, s.thread_id, s.msg_id, below)
    if thread_below:
        out += store.thread_versions(t.namespace, t.agent, t.thread_id, thread_below)
    return out


async def older_versions(
    svc: Services,
    snap: Snapshot,
    t: conv_store.Turn,
    version: int,
    written: dict[str, emb_store.EmbeddingRow],
    *,
    evidence: Sequence[evidence_store.Evidence],
    evidence_docs: Sequence[int],
    summaries: Sequence[conv_store.Turn],
    thread_below: int = 0,
) -> list[store.Removal]:
    """What a removal that writes `version` takes from disk: :func:`removals_of`, with
    the turn's saved copies from the snapshot and each embedding bound found from the
    rows it writes (`written`, by msg_id)."""
    return removals_of(
        t,
        version,
        saved_docs=snap.saved_docs,
        emb_below=await embedding_bound(svc, snap, t, written),
        evidence=evidence,
        evidence_docs=evidence_docs,
        summaries=summaries,
        summary_emb_below={s.msg_id: await embedding_bound(svc, snap, s, written) for s in summaries},
        thread_below=thread_below,
    )


GONE_WAIT_S = 30.0  # how long an op waits for its removal's mutations before answering


async def _count_older(svc: Services, receipt: Receipt, removals: Sequence[store.Removal]) -> None:
    """Count the older versions before the op writes its new ones. A write can start a
    merge that keeps only the newest version of a key, so a count taken after it may
    miss rows the removal found on disk; the receipt names them all, whoever took them."""
    counts = await svc.run(store.count, svc.ch, removals)
    receipt.removed({t: n for t, n in counts.items() if n})


@dataclass(frozen=True, kw_only=True)
class Writes:
    """A removal's new versions: the turn's, the recompaction's, and the derived rows."""

    turn: conv_store.Turn
    rc: Recompaction
    embeddings: Sequence[emb_store.EmbeddingRow] = ()
    evidence: Sequence[evidence_store.Evidence] = ()
    threads: Sequence[thread_store.ThreadRow] = ()


async def write(
    svc: Services, window: Window, receipt: Receipt, removals: Sequence[store.Removal], w: Writes
) -> None:
    """Count the older versions, open the change window, write the new versions in one
    round side by side (the window covers the moment an embedding row may land before
    its transcript row), and note them on the receipt."""
    await _count_older(svc, receipt, removals)
    await window.open()
    ch = svc.ch
    await asyncio.gather(
        svc.run(conv_store.insert, ch, [w.turn, *w.rc.summaries, *w.rc.restored]),
        svc.run(emb_store.insert, ch, w.embeddings) if w.embeddings else asyncio.sleep(0),
        svc.run(evidence_store.insert, ch, w.evidence) if w.evidence else asyncio.sleep(0),
        svc.run(thread_store.insert, ch, w.threads) if w.threads else asyncio.sleep(0),
    )
    receipt.unreadable_ms = receipt.elapsed_ms()
    receipt.wrote("conversations", 1 + len(w.rc.summaries) + len(w.rc.restored))
    derived = {"conversation_embeddings": w.embeddings, "memory_evidence": w.evidence, "threads": w.threads}
    for table, rows in derived.items():
        if rows:
            receipt.wrote(table, len(rows))
    receipt.summaries_tombstoned, receipt.turns_restored = len(w.rc.summaries), len(w.rc.restored)


async def remove_from_disk(svc: Services, receipt: Receipt, removals: Sequence[store.Removal]) -> None:
    """Count the rows again, submit their removal (one mutation per table, durable once
    submitted), then wait for the mutations, bounded by GONE_WAIT_S: done, the receipt
    says ``removal: done`` with ``gone_ms``; not yet (a large part's rewrite, or the
    engine's merges ahead of it), ``removal: pending``: the engine finishes it on its own."""
    counts = await svc.run(store.count, svc.ch, removals)
    tables = [t for t in dict.fromkeys(r.table for r in removals) if counts.get(t)]
    receipt.removed({t: n for t, n in counts.items() if n})
    if not tables:
        return
    await asyncio.gather(*(svc.run(store.remove, svc.ch, t, removals) for t in tables))
    deadline = time.monotonic() + GONE_WAIT_S
    delay = 0.01
    while await svc.run(store.unfinished, svc.ch, tables):
        if time.monotonic() > deadline:
            receipt.removal = "pending"
            return
        await asyncio.sleep(delay)
        delay = min(0.2, delay * 2)
    receipt.gone_ms = receipt.elapsed_ms()


def record(svc: Services, receipt: Receipt, user_id: str) -> None:
    store.record(
        svc.ch,
        store.Record(
            **picked(receipt, *TURN_KEY, "agent", "action", "placeholder", "spans"),
            user_id=user_id,
            token_id=receipt.by,
            redacted_at=receipt.at or utcnow(),
        ),
    )
    receipt.wrote("message_redactions")


__all__ = [
    "RECOMPACT",
    "Receipt",
    "Recompaction",
    "TableCount",
    "Writes",
    "embed_rows",
    "embeddable",
    "guarded",
    "Window",
    "live_row_of_other",
    "embedding_bound",
    "recompaction",
    "record",
    "remove_from_disk",
    "older_versions",
    "removals_of",
    "rewrite_evidence",
    "settle_turns",
    "write",
]
