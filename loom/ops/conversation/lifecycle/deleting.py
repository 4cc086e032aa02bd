"""conversation.delete (admin): tombstone one agent's thread, its turns and their
embeddings.

- ``confirm_thread_id`` must equal ``thread_id``; otherwise the request is refused
  (422 naming the field) before anything is read or written.
- The turns and the thread row get tombstoned versions (tombstone_reason "deleted");
  every read but erasure.export leaves them out, and a table TTL
  (LOOM_RETENTION_CONVERSATIONS_DAYS) removes them from disk.
- Embedding rows are shared by the agents that logged the same turn. After the turns
  are tombstoned, every live embedding row of the thread whose own agent holds no live
  message for the turn (this delete's, or one an earlier delete or compaction left, or
  one whose message the retention TTL expired) passes to another agent's live copy that
  search indexes (a user or assistant turn, or a summary) with the same text: the row
  takes that copy's agent, role, run and user, so the deleting agent's search drops
  it. With no such copy it becomes a tombstone (vector and text emptied). A row of
  exactly 240 characters (an earlier build's cut, or a turn of that length) passes only
  to a copy whose first 2,048 characters match its own agent's turn, and is tombstoned
  when no message row of that agent is left to check that against.
- It runs under the thread lease (save, unsave, append's embedding write and
  compaction share it) and inside search's change window
  (loom.store.search_marks.changing), so conversation.search never serves a deleted
  turn. A deletion fence (loom.store.fences) set before the thread is read makes an
  append racing the delete tombstone its own late row (it answers ``deleted``); an
  embedding in flight re-reads its turn under the lease and writes no late vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.errors import InvalidRequest, Unavailable
from loom.leases import LeaseTimeout, thread_lease
from loom.ops.conversation.common import (
    DELETED,
    EMBED_CHARS,
    EMBEDDED_ROLES,
    KEPT,
    LEGACY_EMBED_CHARS,
    SPEAKER,
    picked,
)
from loom.services import Services
from loom.store import deletion, fences, search_marks
from loom.store import embeddings as emb_store
from loom.store.keys import ThreadKey


class ConfirmationMismatch(InvalidRequest):
    """A confirmation field that does not repeat what it confirms: unprocessable."""

    status = 422


@dataclass(kw_only=True)
class DeleteResult:
    thread_id: str
    agent: str
    deleted: bool
    turns_tombstoned: int = 0
    thread_tombstoned: bool = False
    embeddings_tombstoned: int = 0
    embeddings_handed_over: int = 0


def _indexed(copy: deletion.Copy) -> bool:
    """A copy search indexes: a user or assistant turn, or a compaction summary."""
    return (copy.role in EMBEDDED_ROLES or copy.is_summary) and not copy.high_sensitivity


def heir(
    row: emb_store.EmbeddingRow, own: deletion.Copy | None, others: Sequence[deletion.Copy]
) -> deletion.Copy | None:
    """The live copy an embedding row passes to, or None (the row is tombstoned).

    The copies must share the text the vector was built from. A row of exactly
    LEGACY_EMBED_CHARS characters is ambiguous, so it passes only to a copy whose first
    EMBED_CHARS characters match its own agent's turn, and to none when no message row
    of that agent is left (the retention TTL removed it)."""
    for copy in sorted(others, key=lambda c: c.agent):
        if copy.tombstoned or not _indexed(copy):
            continue
        if len(row.text) == LEGACY_EMBED_CHARS:
            if own is not None and copy.head == own.head:
                return copy
        elif copy.head == row.text:
            return copy
    return None


def emptied(row: emb_store.EmbeddingRow, version: int) -> emb_store.EmbeddingRow:
    """The tombstone of an embedding row no live copy is left for. saved_at stays, so
    the revision reaches the per-user vector index."""
    return replace(
        row, text="", embedding=[], model="", error="", is_saved=False, tombstoned=True, version=version
    )


def handed_to(row: emb_store.EmbeddingRow, target: deletion.Copy) -> emb_store.EmbeddingRow:
    """A new version of a shared embedding row serving `target`, the live copy it passes
    to: that copy's agent, role, run, owner, saved state and origin."""
    return replace(row, **picked(target, *SPEAKER, "is_summary", *KEPT), version=next_version())


@dataclass
class Settled:
    handed_over: int = 0
    tombstoned: int = 0


@dataclass
class ThreadState:
    """What settling reads of a thread: every agent's copy of every turn, and the live
    embedding rows."""

    copies: dict[str, dict[str, deletion.Copy]]
    rows: list[emb_store.EmbeddingRow]

    def retired(self, agent: str, msg_ids: Sequence[str]) -> None:
        """Count the agent's copies of these turns as tombstoned (a writer that reads
        before it tombstones them, under the same lease)."""
        for msg_id in msg_ids:
            own = self.copies.get(msg_id, {}).get(agent)
            if own is not None:
                self.copies[msg_id][agent] = replace(own, tombstoned=True)


def read_thread(svc: Services, namespace: str, thread_id: str) -> ThreadState:
    return ThreadState(
        deletion.copies(svc.ch, namespace, thread_id, EMBED_CHARS),
        deletion.thread_embeddings(svc.ch, namespace, thread_id),
    )


def settle_writes(state: ThreadState) -> tuple[list[emb_store.EmbeddingRow], Settled]:
    """The new versions of every live embedding row of the thread whose own agent holds
    no live message for its turn: passed to a live copy, or tombstoned (rows a live copy
    serves stay as they are)."""
    out = Settled()
    writes: list[emb_store.EmbeddingRow] = []
    for row in state.rows:
        turn = state.copies.get(row.msg_id, {})
        own = turn.get(row.agent)
        if own is not None and not own.tombstoned:
            continue
        target = heir(row, own, [c for a, c in turn.items() if a != row.agent])
        if target is not None:
            writes.append(handed_to(row, target))
            out.handed_over += 1
        else:
            writes.append(emptied(row, next_version()))
            out.tombstoned += 1
    return writes, out


def with_vectors(svc: Services, writes: list[emb_store.EmbeddingRow]) -> list[emb_store.EmbeddingRow]:
    """The writes of rows read without their vectors, the handed-over ones given theirs
    back (a tombstone carries none)."""
    keys = [w.key for w in writes if not w.tombstoned]
    if not keys:
        return writes
    full = emb_store.rows(svc.ch, keys)
    return [w if w.tombstoned else replace(w, embedding=full[w.key].embedding) for w in writes]


def settle(svc: Services, namespace: str, thread_id: str) -> Settled:
    """Pass or tombstone every live embedding row of the thread whose own agent holds no
    live message for its turn (rows a live copy serves stay as they are)."""
    writes, out = settle_writes(read_thread(svc, namespace, thread_id))
    if writes:
        emb_store.insert(svc.ch, writes)
    return out


def _delete_sync(svc: Services, namespace: str, agent: str, thread_id: str) -> DeleteResult:
    turns = deletion.tombstone_turns(svc.ch, namespace, agent, thread_id, DELETED)
    thread = deletion.tombstone_thread(svc.ch, namespace, agent, thread_id)
    settled = settle(svc, namespace, thread_id)
    return DeleteResult(
        thread_id=thread_id,
        agent=agent,
        deleted=bool(turns or thread),
        turns_tombstoned=turns,
        thread_tombstoned=thread,
        embeddings_tombstoned=settled.tombstoned,
        embeddings_handed_over=settled.handed_over,
    )


async def delete(
    svc: Services, who: Principal, namespace: str, agent: str, thread_id: str, confirm_thread_id: str
) -> DeleteResult:
    """conversation.delete (admin)."""
    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    if confirm_thread_id != thread_id:
        raise ConfirmationMismatch(
            "confirm_thread_id must repeat thread_id exactly; nothing was deleted",
            field="confirm_thread_id",
            rule="must_equal_thread_id",
        )
    # The fence first: an append whose row lands after the read below tombstones it.
    await fences.set_fence(svc.redis, ThreadKey(ns, agent, thread_id), next_version())
    try:
        async with (
            thread_lease(svc.redis, ns, thread_id, wait_s=30.0),
            search_marks.changing(svc.redis, svc.ch, svc.run, [(ns, thread_id)]),
        ):
            return await svc.run(_delete_sync, svc, ns, agent, thread_id)
    except LeaseTimeout:
        raise Unavailable(
            "the conversation is busy with another write; retry the delete", field="thread_id", rule="retry"
        ) from None


__all__ = ["ConfirmationMismatch", "DeleteResult", "delete", "heir", "settle"]
