"""conversation.delete_message: remove one turn (namespace, agent, thread_id, msg_id),
its embedding row and every copy derived from it, and answer a receipt.

Who may: an admin; a writer, for a turn its own token appended (the transcript row
records the appending token, ``appended_by``; a turn stored before that column, or not
by an append, has none, so only an admin may remove it). Role and scope are checked
before anything is read (loom.auth.policy); whose turn it is, right after the turn is
read, before anything is written.

An end-user token (read scope ``own_user``) never removes a recorded turn: the owner
chose to record it. Its delete of its own saved message does what
conversation.unsave_message does (the saved copy and its indexes go; a row that existed
only because of the save goes with it; a recorded turn stays, unflagged), and answers
``unsaved: true``. Any other message answers ``found: false``, never saying whether it
exists or whose it is.

The turn gets a tombstoned version (reason ``deleted``) with its text, reasoning and
metadata emptied: the tombstone keeps the turn counted as landed (a retried append of
it stays a duplicate) and holds nothing of it. Everything else follows the rules of
loom.ops.conversation.lifecycle.message_removal: the embedding row passes to another agent's live
copy with the same text or is tombstoned, the saved index and memory evidence lose
their copies, a summary built from the turn is tombstoned and the turns it replaced come
back, and every older version is removed from disk before the answer.

A missing turn is a 404 naming ``msg_id``. Asked again, a removed turn answers
``found: false, deleted: false`` (200) with no table counts: nothing is left to do (an
older version a removal cut short by a failure left on disk is removed then, and
counted).
"""

from __future__ import annotations

from dataclasses import replace

from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Forbidden
from loom.models.conversation.saved import UnsaveRequest
from loom.ops.conversation.common import DELETED
from loom.ops.conversation.lifecycle import message_removal as mr
from loom.ops.conversation.saved import saving
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import redaction as store

UNSAVED = "unsaved"  # the receipt's action for an end-user token's delete


def _check_owner(who: Principal, t: conv_store.Turn) -> None:
    """Whose turn it is: the admin's any, a writer's the ones its token appended."""
    if who.role >= Role.admin:
        return
    if not t.appended_by or t.appended_by != who.token_id:
        raise Forbidden(
            "a writer may delete only the messages its own token appended", field="msg_id", rule="appended_by"
        )


def _nothing_left(t: conv_store.Turn) -> bool:
    return t.tombstoned and t.tombstone_reason == DELETED and not t.content and not t.reasoning


async def delete_message(
    svc: Services, who: Principal, namespace: str, agent: str, thread_id: str, msg_id: str
) -> mr.Receipt:
    """conversation.delete_message (admin; a writer for its own turns; an end-user token
    unsaves its own saved message)."""
    who.require_role(Role.writer)
    ns = who.namespace(namespace)
    if who.bounded:
        return await _unsave_own(svc, who, ns, agent, thread_id, msg_id)
    receipt = mr.Receipt(
        namespace=ns, agent=agent, thread_id=thread_id, msg_id=msg_id, action=store.DELETED, by=who.token_id
    )
    async with mr.guarded(svc, ns, thread_id) as window:
        v, snap, t = await mr.snapshot_of_turn(svc, ns, agent, thread_id, msg_id)
        _check_owner(who, t)
        if _nothing_left(t):
            # Removed before. Only older versions a removal cut short left on disk can
            # remain: counted (none, normally) and removed, nothing written.
            receipt.found = False
            removals = mr.removals_of(
                t,
                t.version,
                saved_docs=[],
                emb_below=await mr.embedding_bound(svc, snap, t, {}),
                evidence=[],
                evidence_docs=[],
                summaries=[],
                summary_emb_below={},
            )
        else:
            removals = await _delete(svc, window, snap, t, v, receipt)
    # Outside the lease and the change window: what is readable no longer changes (only
    # versions below the ones just written go), and a long rewrite holds up no writer.
    if receipt.done:
        await svc.run(mr.record, svc, receipt, t.user_id)
    await mr.remove_from_disk(svc, receipt, removals)
    return receipt


async def _unsave_own(
    svc: Services, who: Principal, ns: str, agent: str, thread_id: str, msg_id: str
) -> mr.Receipt:
    """An end-user token's delete: the unsave of its own saved message."""
    receipt = mr.Receipt(
        namespace=ns, agent=agent, thread_id=thread_id, msg_id=msg_id, action=UNSAVED, by=who.token_id
    )
    req = UnsaveRequest(namespace=ns, conversation_id=thread_id, message_id=msg_id, agent=agent)
    result = await saving.unsave_message(svc, who, req)
    receipt.found = result.found
    receipt.done = result.removed
    receipt.unsaved = result.found
    receipt.at = utcnow() if result.found else None
    if result.found:
        receipt.wrote("conversations")
    return receipt


async def _delete(
    svc: Services, window: mr.Window, snap: mr.Snapshot, t: conv_store.Turn, v: int, receipt: mr.Receipt
) -> list[store.Removal]:
    at = utcnow()
    rc = await svc.run(mr.recompaction, svc, snap, v) if snap.summaries else mr.Recompaction()
    tomb = replace(
        t,
        content="",
        reasoning="",
        metadata={},
        tombstoned=True,
        tombstoned_at=t.tombstoned_at if t.tombstoned else at,
        tombstone_reason=DELETED,
        version=v,
    )
    evidence = snap.evidence.holding(t.user_id, t.content)
    retired = {t.agent: [t.msg_id, *(s.msg_id for s in rc.summaries)]}
    handed, tombs = await svc.run(mr.settle_turns, svc, snap, retired)
    fresh = await mr.embed_rows(svc, [r for r in rc.restored if not mr.live_row_of_other(snap, r)])
    rows = [*handed, *tombs, *fresh]
    new_evidence = mr.rewrite_evidence(evidence, lambda _c: "", v)
    mine = {r.msg_id: r for r in [*handed, *tombs]}
    removals = await mr.older_versions(
        svc,
        snap,
        t,
        v,
        mine,
        evidence=new_evidence,
        evidence_docs=evidence.all_docs(),
        summaries=rc.summaries,
    )
    await mr.write(
        svc, window, receipt, removals, mr.Writes(turn=tomb, rc=rc, embeddings=rows, evidence=new_evidence)
    )
    receipt.embedding = (
        "handed_over"
        if t.msg_id in {r.msg_id for r in handed}
        else "tombstoned"
        if t.msg_id in mine
        else "none"
    )
    receipt.done = True
    receipt.at = at
    return removals


__all__ = ["delete_message"]
