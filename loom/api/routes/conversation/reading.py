"""Routes of the conversation plane. Every op refuses tokens bound to one user or
session (a thread mixes users and has no user axis to bound)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi.responses import JSONResponse

from loom.api.deps import Caller, Svc, op_router
from loom.api.direct import DirectRoute
from loom.models.conversation.reading import (
    AppendBatchResponse,
    AppendRequest,
    AppendResponse,
    CreateRequest,
    CreateResponse,
    GetRequest,
    GetResponse,
    HighTurnOut,
    HighTurnsRequest,
    HighTurnsResponse,
    ListRequest,
    ListResponse,
    MessageOut,
    ReembedRequest,
    ReembedResponse,
    ThreadOut,
    ThreadsRequest,
    ThreadsResponse,
    ThreadSummaryOut,
    UpdateRequest,
)
from loom.models.errors import error_responses
from loom.ops import conversation as ops
from loom.ops.conversation.common import as_utc
from loom.ops.conversation.writing.appending import AppendResult
from loom.store.conversations import Turn

router = op_router("conversation")


# The columns of a turn the API shows: MessageOut's fields (not the row's tombstone,
# origin, author or version columns).
_SHOWN = tuple(f for f in MessageOut.model_fields if f != "embedding")


def _messages(turns: list[Turn], embedding: dict[str, str] | None = None) -> list[MessageOut]:
    """The turns as the API shows them: times in UTC, the embedding state when asked."""
    out = []
    for t in turns:
        fields = {f: getattr(t, f) for f in _SHOWN}
        fields["ts"] = as_utc(t.ts)
        fields["saved_at"] = as_utc(t.saved_at) if t.saved_at else None
        fields["embedding"] = embedding.get(t.msg_id) if embedding is not None else None
        out.append(MessageOut(**fields))
    return out


async def append(body: AppendRequest, who: Caller, svc: Svc) -> JSONResponse:
    """Store one turn, or a batch (`turns`, up to 500) for ingest.

    The turn is kept per (namespace, **agent**, thread_id): `agent` in the body names
    the calling agent (default `"default"`). The first append creates the thread.

    Nothing is kept, with `stored: false`, when the namespace does not record
    (`reason: "logging_disabled"`; see conversation.set_logging), when this agent's
    `(thread_id, msg_id)` already landed (`"duplicate"`; without `msg_id` the server
    derives one from thread, role and content), or when the turn was removed while
    its embedding ran (`"deleted"`). The answer comes once the turn is durable and
    says what became of its embedding: `"embedded"`, `"failed"` (fail-open: the turn
    stays stored, the error is recorded, nothing retries it) or `"skipped:<why>"`
    (system and tool turns, and a turn that reads as high, are never embedded).
    """
    results = await ops.append(svc, who, body.namespace, body.agent, body.each_turn())
    ns = who.namespace(body.namespace)
    # The hot path: the answer is built as it is documented (AppendResponse /
    # AppendBatchResponse) and sent without a second validation pass.
    if body.is_batch:
        return JSONResponse(
            {
                "namespace": ns,
                "agent": body.agent,
                "stored": sum(r.stored for r in results),
                "results": [_result(r) for r in results],
            }
        )
    return JSONResponse({"namespace": ns, "agent": body.agent, **_result(results[0])})


# The hottest route: served by DirectRoute (same declaration and answers, without
# FastAPI's per-request dependency resolver; see loom/api/direct.py).
router.add_api_route(
    "/conversation.append",
    append,
    methods=["POST"],
    response_model=AppendResponse | AppendBatchResponse,
    route_class_override=DirectRoute,
)


def _result(r: AppendResult) -> dict[str, object]:
    """An AppendTurnResult as JSON: the result's fields are its fields, in its order."""
    return asdict(r)


@router.post("/conversation.create", response_model=CreateResponse)
async def create(body: CreateRequest, who: Caller, svc: Svc) -> CreateResponse:
    """Start a thread with a title, metadata or run_id up front (appends create threads
    on their own; this only attaches those). On an existing thread the given fields are
    attached to it and `created` is false."""
    view, created = await ops.create(svc, who, body)
    return CreateResponse(**asdict(view), created=created)


@router.post("/conversation.update", response_model=ThreadOut, responses=error_responses(404))
async def update(body: UpdateRequest, who: Caller, svc: Svc) -> ThreadOut:
    """Change a thread's title, metadata or run_id. New metadata replaces the old one,
    including the titler's `title_refused` mark."""
    view = await ops.update(svc, who, body)
    return ThreadOut(**asdict(view))


@router.post("/conversation.threads", response_model=ThreadsResponse)
async def threads(body: ThreadsRequest, who: Caller, svc: Svc) -> ThreadsResponse:
    """Recent threads, newest first, with each one's title and an excerpt of its last
    turn. `agent: "*"` lists every agent's threads. A last turn or a title that reads as
    high is shown empty."""
    found, has_more = await ops.threads(svc, who, body)
    return ThreadsResponse(
        threads=[ThreadSummaryOut(**asdict(t)) for t in found],
        limit=body.limit,
        offset=body.offset,
        has_more=has_more,
    )


@router.post("/conversation.get", response_model=GetResponse, responses=error_responses(404))
async def get(body: GetRequest, who: Caller, svc: Svc) -> GetResponse:
    """One thread's metadata and the first page of its turns (`order: "desc"` for the
    tail, `cursor` for the next page); `include_messages: false` for the metadata alone
    (`messages: []`)."""
    view, page = await ops.get(svc, who, body)
    if page is None:
        return GetResponse(thread=ThreadOut(**asdict(view)))
    return GetResponse(
        thread=ThreadOut(**asdict(view)),
        messages=_messages(page.messages, page.embedding),
        next_cursor=page.next_cursor,
    )


@router.post("/conversation.list", response_model=ListResponse)
async def list_turns(body: ListRequest, who: Caller, svc: Svc) -> ListResponse:
    """A thread's turns, oldest first (`order: "desc"` for newest first), in pages of
    `limit`; pass `next_cursor` back as `cursor`. Optionally only one run's turns."""
    page = await ops.list_turns(svc, who, body)
    return ListResponse(messages=_messages(page.messages, page.embedding), next_cursor=page.next_cursor)


@router.post("/conversation.high_turns", response_model=HighTurnsResponse)
async def high_turns(body: HighTurnsRequest, who: Caller, svc: Svc) -> HighTurnsResponse:
    """The namespace's live turns that read as high sensitivity (stored as written, never
    embedded), newest first, with the kinds of shape found and never the text: so an
    owner can find them and delete or redact them."""
    turns, more = await ops.high_turns(svc, who, body.namespace, limit=body.limit, offset=body.offset)
    return HighTurnsResponse(
        turns=[HighTurnOut(**asdict(t)) for t in turns], limit=body.limit, offset=body.offset, has_more=more
    )


@router.post("/conversation.reembed", response_model=ReembedResponse)
async def reembed(body: ReembedRequest, who: Caller, svc: Svc) -> ReembedResponse:
    """Rebuild the namespace's vectors from the text each embedding row keeps (2,048
    characters, or 240 for rows of earlier builds), e.g. after a model change. Skips
    tombstoned rows and rows whose text reads as high."""
    report = await ops.reembed(svc, who, body.namespace, thread_id=body.thread_id)
    return ReembedResponse(**asdict(report))
