"""conversation.save_message and conversation.unsave_message (writer).

A saved message is a conversation row flagged ``is_saved`` with ``saved_at``, and its
embedding row flagged the same way; it is never re-labelled (a message the transcript
already holds keeps its run_id and content). The Record conversations switch does not
apply to a save, and a save does not turn recording on.

Who owns a saved message: the transcript row. A save claims only a row no user owns
('' user_id) or the caller owns, in the revision itself (an INSERT ... SELECT whose
WHERE is the claim, :func:`loom.store.saved.claim`), under the thread lease; it then
reads the row back and flags the embedding row only if the row reads as the caller's.
Of two users saving one unowned message the first claims it; the second is answered
owner_mismatch.

A save can be retried and repairs what an interrupted or concurrent call left: each
call re-reads the message under the lease and writes a missing embedding row, embeds
again when the last embed failed, and flags rows still unflagged. A new message's
insert carries a deduplication token derived from its identity (plus the generation
an unsave's removal started), so two concurrent saves of it store one row; it also
takes append's claim on the turn (loom.ops.conversation.writing.appending), so an append of
the same turn racing the save answers duplicate instead of writing over the flag. The
claim is a live writer's, as an append flush's is: while the save runs, an append of
the turn waits for its row; a save that failed releases it, and one that died (between
its claim and its insert) is taken over once its live mark lapses, so no append is
answered duplicate for a row that never landed. Likewise a save waits on a live
flush's claim, and takes over a dead one's.

How a row came to exist decides what an unsave does (``origin``, migration 007). A
message new to the transcript is stored saved-only: it belongs to the user who saved
it, only the saved-message ops read it (never conversation.search, threads, get or
list), and unsaving removes it (lightweight delete, ``removed: true``). A row the
transcript recorded is flagged in place and stays recorded; unsaving clears its flag,
whatever the recording switch says by then. An append of a saved-only turn while the
namespace records makes it recorded (loom.ops.conversation.writing.origin).

Provider work first: the embedding is computed (inline, in this process) before the
thread lease is taken; under the lease the state is re-read and, when it changed so
that the computed vector no longer fits, the round starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from loom import failures, replicas
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import CapabilityMissing, Forbidden, InvalidRequest, Unavailable
from loom.leases import LeaseTimeout, thread_lease
from loom.models.conversation.saved import (
    SaveReason,
    SaveRequest,
    SaveResponse,
    UnsaveRequest,
    UnsaveResponse,
)
from loom.ops.conversation.common import (
    EMBEDDED_ROLES,
    KEPT,
    SPEAKER,
    TURN_KEY,
    as_utc,
    embed_text,
    model_text,
    picked,
)
from loom.ops.conversation.lifecycle.deleting import emptied
from loom.ops.conversation.writing.appending import (
    CLAIM_TTL_S,
    CONTEST_POLL_S,
    CONTEST_WAIT_S,
    FLUSH_LIVE_MS,
    claim_key,
    pipeline,
)
from loom.ops.embedding import inline
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import landed, search_marks
from loom.store import saved as saved_store
from loom.store.keys import TurnKey
from loom.store.transcript_postings import speaker_of

# Reasons of a save (stable strings clients match on: never change one).
OWNER_MISMATCH: Final = "owner_mismatch"
DELETED: Final = "deleted"
UNSUPPORTED_ROLE: Final = "unsupported_role"
HIGH_SENSITIVITY: Final = "high_sensitivity"
EMBED_FAILED: Final = "embed_failed"

MAX_ROUNDS = 4  # re-reads when the message changed under a computed vector


def acting_user(who: Principal, user_id: str | None) -> str:
    """The user a saved-message op acts for. A token pinned to one user acts as that
    user only (a body naming another is refused); any other token must name one."""
    if who.read_scope == "own_user":
        if user_id is not None and user_id != who.read_user_id:
            raise Forbidden(
                "this token acts for one user only; user_id must be that user or left out",
                field="user_id",
                rule="own_user",
            )
        return who.read_user_id
    if who.bounded:  # own_session: the routes refuse it first; never act for no user
        raise Forbidden(
            "an own_session token cannot call this op: conversation rows have no session", rule="read_scope"
        )
    if not user_id:
        raise InvalidRequest(
            "user_id is required (the user whose saved messages these are)", field="user_id", rule="required"
        )
    return user_id


@dataclass
class NewMessage:
    """What a client sends to save a message the transcript does not hold yet (role and
    content are required then, and ignored for a message the transcript holds)."""

    role: str | None
    content: str | None
    run_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    ts: datetime | None = None


def _new_message(req: SaveRequest) -> NewMessage | None:
    """What the request says about a message the transcript may not hold (role and
    content are required only then, which save_message decides)."""
    if req.role is None and req.content is None:
        return None
    return NewMessage(req.role, req.content, req.run_id, dict(req.metadata), req.ts)


def _turn_of(who: Principal, req: SaveRequest | UnsaveRequest) -> tuple[TurnKey, str]:
    """A writer's (un)save: the message it names, and the user it acts for."""
    who.require_role(Role.writer)
    ns = who.namespace(req.namespace)
    return TurnKey(ns, req.agent, req.conversation_id, req.message_id), acting_user(who, req.user_id)


def _refused(
    key: TurnKey, reason: SaveReason, *, saved: bool = False, saved_at: datetime | None = None
) -> SaveResponse:
    """A save that leaves the message out of the vector leg, and why (`saved`: it stays
    saved all the same)."""
    return SaveResponse(
        conversation_id=key.thread_id,
        message_id=key.msg_id,
        saved=saved,
        indexed=False,
        reason=reason,
        saved_at=saved_at,
    )


@dataclass(frozen=True)
class _Vector:
    """An inline embed of `text` (done before the lease), or the error it met."""

    text: str
    result: inline.InlineResult


@dataclass(frozen=True)
class _State:
    row: saved_store.TranscriptRow | None
    emb: emb_store.EmbeddingRow | None


def _read_state(svc: Services, key: TurnKey) -> _State:
    row = saved_store.transcript_row(svc.ch, key)
    emb = emb_store.get(svc.ch, key[0], key[2], key[3])
    return _State(row, emb)


def _has_live_vector(emb: emb_store.EmbeddingRow | None, text: str) -> bool:
    return (
        emb is not None
        and not emb.tombstoned
        and not emb.error
        and len(emb.embedding) > 0
        and emb.text == text
    )


# -- the checks ------------------------------------------------------------------------


def _refusal(
    key: TurnKey, row: saved_store.TranscriptRow | None, user: str, new: NewMessage | None
) -> SaveResponse | None:
    """Why this message cannot be saved for `user` (None: it can). Applies as well to a
    message that is already saved; the answer says whether it stays saved."""
    if row is None:
        for name in ("content", "role"):
            if new is None or getattr(new, name) is None:
                raise InvalidRequest(
                    f"the transcript does not hold this message; send role and content to save it "
                    f"({name} is missing)",
                    field=name,
                    rule="required_for_new_message",
                )
        assert new is not None and new.content is not None
        if new.role not in EMBEDDED_ROLES:
            return _refused(key, UNSUPPORTED_ROLE)
        if reads_as_high(new.content):
            return _refused(key, HIGH_SENSITIVITY)  # not stored
        return None
    # Another user's message: say nothing more about it (not whether it is deleted).
    if row.user_id not in ("", user):
        return _refused(key, OWNER_MISMATCH)
    if row.tombstoned:
        return _refused(key, DELETED)
    mine = row.is_saved and row.user_id == user
    saved_at = as_utc(row.saved_at) if mine and row.saved_at else None
    if row.role not in EMBEDDED_ROLES:
        return _refused(key, UNSUPPORTED_ROLE, saved=mine, saved_at=saved_at)
    if row.high_sensitivity or reads_as_high(row.content):
        return _refused(key, HIGH_SENSITIVITY, saved=mine, saved_at=saved_at)
    return None


# -- save ------------------------------------------------------------------------------


async def _every_replica_keeps_saved_state(svc: Services) -> None:
    """A save is taken only while every live replica keeps saved turns through compaction
    and deletes: during a rolling deploy an older one could summarise the saved turn away."""
    if replicas.SAVED_STATE not in await replicas.shared(svc.redis):
        raise CapabilityMissing(
            "saving is paused while a live replica of this deploy does not keep saved messages "
            "through compaction; it resumes once every replica runs a newer build",
            rule="capability",
            capability=replicas.SAVED_STATE,
        )


async def save_message(svc: Services, who: Principal, req: SaveRequest) -> SaveResponse:
    """conversation.save_message (writer): flag one message saved for the acting user,
    storing it first when the transcript does not hold it."""
    key, user = _turn_of(who, req)
    ns, new = key.namespace, _new_message(req)
    await _every_replica_keeps_saved_state(svc)
    vector: _Vector | None = None
    for _ in range(MAX_ROUNDS):
        state = await svc.run(_read_state, svc, key)
        refused = _refusal(key, state.row, user, new)
        if refused is not None:
            return refused
        text = embed_text(
            state.row.content if state.row is not None else new.content if new and new.content else ""
        )
        if (vector is None or vector.text != text) and not _has_live_vector(state.emb, text):
            # Provider work before the lease; screened above (never text that reads as high).
            role = state.row.role if state.row is not None else (new.role if new else None) or ""
            meta = state.row.metadata if state.row is not None else new.metadata if new else None
            read = model_text(text, role, False, svc.settings.embed_speaker_prefix, speaker_of(meta))
            vector = _Vector(text, await inline.embed(svc, [read]))
        async with _lease(svc, ns, key.thread_id):
            done = await _save_under_lease(svc, key, user, new, vector)
        if done is not None:
            return done
    raise Unavailable(
        "the message kept changing while it was being saved; retry the save", field="message_id", rule="retry"
    )


async def _save_under_lease(
    svc: Services, key: TurnKey, user: str, new: NewMessage | None, vector: _Vector | None
) -> SaveResponse | None:
    """One round under the thread lease. None: start again (the message changed so that
    the round cannot finish: a racing append's row landed, or a vector is missing)."""
    state = await svc.run(_read_state, svc, key)
    refused = _refusal(key, state.row, user, new)
    if refused is not None:
        return refused
    row = state.row
    if row is None:
        assert new is not None  # _refusal raised otherwise
        row = await _store_new(svc, key, user, new, state.emb)
        if row is None:
            return None
    elif not (row.is_saved and row.user_id == user):
        await svc.run(saved_store.claim, svc.ch, key, user, _now_ms(), next_version())
        row = await svc.run(saved_store.transcript_row, svc.ch, key)
        if row is None:
            return None
    # The read-back decides: the embedding row is flagged only for the caller's row.
    refused = _refusal(key, row, user, None)
    if refused is not None:
        return refused
    if not row.is_saved:
        return None
    return await svc.run(_write_embedding, svc, row, state.emb, vector)


@contextlib.asynccontextmanager
async def _lease(svc: Services, namespace: str, thread_id: str) -> AsyncIterator[None]:
    """The thread lease shared with append's embedding write, compaction and deletion
    (renewed while held). A thread busy for too long is a 503 the client retries. What
    is written under it rewrites existing rows, so search's marks are raised around it."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(thread_lease(svc.redis, namespace, thread_id))
        except LeaseTimeout:
            raise Unavailable(
                "the conversation is busy with another write; retry", field="conversation_id", rule="retry"
            ) from None
        await stack.enter_async_context(
            search_marks.changing(svc.redis, svc.ch, svc.run, [(namespace, thread_id)])
        )
        yield


def _now_ms() -> datetime:
    """saved_at's precision (DateTime64(3)), so what is answered is what reads back."""
    now = utcnow()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _dedup_token(key: TurnKey, generation: int) -> str:
    h = hashlib.sha256()
    for part in (*key, str(generation)):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return "save-" + h.hexdigest()[:40]


async def _store_new(
    svc: Services, key: TurnKey, user: str, new: NewMessage, emb: emb_store.EmbeddingRow | None
) -> saved_store.TranscriptRow | None:
    """Insert a new message, saved. Returns the row as it reads back, or None when a
    racing append's row landed instead (the caller starts the round again)."""
    # A removal by unsave leaves a tombstoned embedding row; its version starts a new
    # generation, so saving the message again is not taken for a duplicate insert.
    generation = emb.version if emb is not None and emb.tombstoned else 0
    token = _dedup_token(key, generation)
    writer = f"{landed.SAVE_CLAIM_PREFIX}{token}"  # the claim's value, and the save's live mark
    appends = pipeline(svc)
    async with appends.live(writer):
        if not await _claim_turn(svc, key, writer):
            return None
        try:
            return await _insert_new(svc, key, user, new, token)
        except Exception:
            # The insert returned an error (its row may have landed all the same: an
            # append that claims the turn next reads the store, since the save noted
            # it). Released, so an append of the turn goes on at once. A cancelled save
            # keeps its claim: its insert may still be running in its thread; its live
            # mark lapses and an append then takes the claim over, reading the store.
            await appends.release([key], writer)
            raise


async def _insert_new(
    svc: Services, key: TurnKey, user: str, new: NewMessage, token: str
) -> saved_store.TranscriptRow:
    now = _now_ms()
    ts = as_utc(new.ts) if new.ts is not None else utcnow()
    assert new.role is not None and new.content is not None  # _refusal checked
    turn = conv_store.Turn(
        namespace=key[0],
        agent=key[1],
        thread_id=key[2],
        msg_id=key[3],
        ts=ts,
        role=new.role,
        content=new.content,
        user_id=user,
        run_id=new.run_id,
        metadata=dict(new.metadata),
        high_sensitivity=False,
        is_saved=True,
        saved_at=now,
        origin=conv_store.SAVED_ONLY,
        version=next_version(),
    )
    for attempt in range(2):
        # The first insert's token is the message's: a concurrent save of it inserts
        # nothing more. A row that does not read back (a delete that was not an unsave
        # left the token in the window) is inserted once more under a token of its own.
        tok = token if attempt == 0 else f"{token}-{next_version()}"
        await svc.run(conv_store.insert, svc.ch, [turn], dedup_token=tok)
        row = await svc.run(saved_store.transcript_row, svc.ch, key)
        if row is not None:
            return row
    raise Unavailable(
        "the saved message did not land in the store; retry the save", field="message_id", rule="retry"
    )


async def _claim_turn(svc: Services, key: TurnKey, writer: str) -> bool:
    """Take append's claim on the turn (one key per turn, shared with append's flushes,
    claimed and noted by the same script, live under the same marks), so that an
    append of the same turn answers duplicate rather than writing a second, unsaved row
    over the saved one. False: the turn's row landed (an append's, or an earlier save's):
    save it in place. A live writer's claim is waited on (CONTEST_WAIT_S, then 503)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONTEST_WAIT_S
    pause, longest = CONTEST_POLL_S
    while True:
        [noted] = await landed.claim_and_note(
            svc.redis, [key], [claim_key(key)], writer, CLAIM_TTL_S, FLUSH_LIVE_MS
        )
        if noted.claimed and not noted.taken_over:
            return True  # new, or this same save retried: the token dedups the insert
        # Taken over from a writer that died (its row may have landed), or held by a
        # live one (its row may land).
        if await svc.run(saved_store.transcript_row, svc.ch, key) is not None:
            return False
        if noted.claimed:
            return True
        if loop.time() >= deadline:
            raise Unavailable(
                "another write of the same message has not finished; retry the save",
                field="message_id",
                rule="retry",
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)


def _write_embedding(
    svc: Services, row: saved_store.TranscriptRow, emb: emb_store.EmbeddingRow | None, vector: _Vector | None
) -> SaveResponse | None:
    """Under the lease, once the transcript row reads back as the caller's: make the
    embedding row a flagged copy of it (a live vector of the same text is kept, a failed
    or missing one is written from `vector`). None: a vector is needed and `vector`
    does not fit the text (the caller embeds and starts again)."""
    text = embed_text(row.content)
    saved_at = row.saved_at
    result = SaveResponse(
        conversation_id=row.thread_id,
        message_id=row.msg_id,
        saved=True,
        indexed=True,
        reason=None,
        saved_at=as_utc(saved_at) if saved_at else None,
    )
    flags = picked(row, *SPEAKER, "ts", *KEPT) | {"is_saved": True, "tombstoned": False}
    if emb is not None and _has_live_vector(emb, text):
        if row.saved_only and emb.origin == conv_store.RECORDED and emb.agent != row.agent:
            # The vector serves another agent's recorded copy of the same text: it keeps
            # serving that copy in conversation.search (a saved-only copy never would),
            # and is flagged for the saver's own search as well.
            flags.update(
                agent=emb.agent, role=emb.role, run_id=emb.run_id, ts=emb.ts, origin=conv_store.RECORDED
            )
        if any(getattr(emb, k) != v for k, v in flags.items()):
            emb_store.insert(svc.ch, [replace(emb, **flags, version=next_version())])
        return result
    if vector is None or vector.text != text:
        return None
    if vector.result.ok:
        assert vector.result.vectors is not None
        fresh = emb_store.EmbeddingRow(
            **picked(row, *TURN_KEY),
            text=text,
            embedding=vector.result.vectors[0],
            model=vector.result.model_id,
            version=next_version(),
            **flags,
        )
        emb_store.insert(svc.ch, [fresh])
        return result
    # Fail-open: stored and saved; the error is recorded and a later save retries it.
    failed = emb_store.EmbeddingRow(
        **picked(row, *TURN_KEY),
        text=text,
        embedding=[],
        model="",
        error=failures.safe(vector.result.error),
        version=next_version(),
        **flags,
    )
    emb_store.insert(svc.ch, [failed])
    result.indexed, result.reason = False, EMBED_FAILED
    return result


# -- unsave ----------------------------------------------------------------------------


async def unsave_message(svc: Services, who: Principal, req: UnsaveRequest) -> UnsaveResponse:
    """conversation.unsave_message (writer): withdraw a saved message from its owner's
    search: a saved-only row is removed (removed: true), a recorded one keeps its place
    in the transcript with the flag cleared. found: false for a message this user has
    not saved (never saved, or saved by another user: the answer does not say which)."""
    key, user = _turn_of(who, req)
    async with _lease(svc, key.namespace, key.thread_id):
        result = await svc.run(_unsave_sync, svc, key, user)
        if result.removed:
            # The row is gone: no claim may keep saying the turn landed.
            await svc.redis.delete(claim_key(key))
    return result


def _unsave_sync(svc: Services, key: TurnKey, user: str) -> UnsaveResponse:
    ch = svc.ch
    row = saved_store.transcript_row(ch, key)
    if row is None or row.tombstoned or row.user_id != user or not row.is_saved:
        return UnsaveResponse(found=False, removed=False)
    # A recorded row is the namespace's transcript (recorded when the switch was on,
    # whatever it says now): only the flag goes. A saved-only row existed only because
    # of the save: it goes too.
    removed = row.saved_only
    saved_store.unflag(ch, key, user, next_version())
    if removed:
        saved_store.remove(ch, key, user)
    _unsave_embedding(svc, row, removed=removed)
    return UnsaveResponse(found=True, removed=removed)


def _unsave_embedding(svc: Services, row: saved_store.TranscriptRow, *, removed: bool) -> None:
    """The shared embedding row after an unsave: it serves another agent's live copy of
    the turn if one is left (flagged as that copy is), else it stays unflagged (the turn
    stays recorded) or becomes a tombstone (the turn was removed), a newer version an
    older one cannot come back over."""
    ch = svc.ch
    emb = emb_store.get(ch, row.namespace, row.thread_id, row.msg_id)
    others = [
        c for c in saved_store.copies(ch, row.namespace, row.thread_id, row.msg_id) if c.agent != row.agent
    ]
    version = next_version()
    if others:
        if emb is None:
            return
        other = max(others, key=lambda c: (c.is_saved, c.saved_at or datetime.min))
        emb_store.insert(
            ch,
            [replace(emb, **picked(other, *SPEAKER, *KEPT), version=version)],
        )
    elif not removed:
        if emb is not None:
            emb_store.insert(ch, [replace(emb, is_saved=False, version=version)])
    elif emb is not None:
        emb_store.insert(ch, [emptied(emb, version)])
    else:
        emb_store.insert(
            ch,
            [
                emb_store.EmbeddingRow(
                    **picked(row, *TURN_KEY, *SPEAKER, "ts"),
                    text="",
                    embedding=[],
                    model="",
                    saved_at=row.saved_at or datetime.now(UTC),
                    tombstoned=True,
                    version=version,
                )
            ],
        )


__all__ = [
    "DELETED",
    "EMBED_FAILED",
    "HIGH_SENSITIVITY",
    "OWNER_MISMATCH",
    "UNSUPPORTED_ROLE",
    "NewMessage",
    "acting_user",
    "save_message",
    "unsave_message",
]
