"""Routes of the saved-message ops. Unlike the rest of the conversation plane they take
a token pinned to one user (own_user), which acts as that user only; an own_session
token is refused (conversation rows have no session)."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models.conversation import saved as s
from loom.ops.conversation.saved import saved_reads, saving

router = op_router("saved messages")


@router.post("/conversation.save_message", response_model=s.SaveResponse)
async def save_message(body: s.SaveRequest, who: Caller, svc: Svc) -> s.SaveResponse:
    """Save one message for a user, for conversation.search_saved_messages. Works whether
    or not the namespace records conversations (and does not turn recording on). A
    message the transcript holds is flagged in place (its run_id and content stay);
    send `role` and `content` to save one it does not hold. Ownership, deletion, role
    and sensitivity are checked on every save (`reason`); saving again is safe and
    repairs what an interrupted save left (a failed embed is retried)."""
    return await saving.save_message(svc, who, body)


@router.post("/conversation.unsave_message", response_model=s.UnsaveResponse)
async def unsave_message(body: s.UnsaveRequest, who: Caller, svc: Svc) -> s.UnsaveResponse:
    """Withdraw a saved message from its owner's search. Where the namespace records,
    the turn stays in the transcript with the flag cleared; where it does not, it is
    removed (`removed: true`). Idempotent; saving again restores it."""
    return await saving.unsave_message(svc, who, body)


@router.post("/conversation.list_saved_messages", response_model=s.ListSavedResponse)
async def list_saved_messages(body: s.ListSavedRequest, who: Caller, svc: Svc) -> s.ListSavedResponse:
    """One user's saved messages, most recently saved first (`ts` is when the user
    saved it), in pages of `limit`; pass `next_cursor` back as `cursor`."""
    page = await saved_reads.list_saved_messages(svc, who, body)
    return s.ListSavedResponse(
        messages=[s.SavedMessageOut(**asdict(m)) for m in page.messages], next_cursor=page.next_cursor
    )


@router.post("/conversation.saved_status", response_model=s.SavedStatusResponse)
async def saved_status(body: s.SavedStatusRequest, who: Caller, svc: Svc) -> s.SavedStatusResponse:
    """Which of up to 500 messages of one conversation this user has saved."""
    saved = await saved_reads.saved_status(
        svc, who, body.namespace, body.user_id, body.conversation_id, body.message_ids
    )
    return s.SavedStatusResponse(saved=saved)


@router.post("/conversation.search_saved_messages", response_model=s.SearchSavedResponse)
async def search_saved_messages(body: s.SearchSavedRequest, who: Caller, svc: Svc) -> s.SearchSavedResponse:
    """Search one user's saved messages in one namespace. `hybrid` (default) fuses a
    vector leg (the first 2,048 characters' embedding) and a BM25 leg (the whole text)
    by reciprocal rank, `lexical_weight` scaling the BM25 leg; `semantic` and `lexical`
    run one leg. When the query cannot be embedded the answer is lexical, with
    `fallback_reason`."""
    found = await saved_reads.search_saved_messages(svc, who, body)
    return s.SearchSavedResponse.model_validate(found, from_attributes=True)
