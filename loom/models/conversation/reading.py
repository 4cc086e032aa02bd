"""Requests and responses of the conversation plane's ops."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from loom.limits import MAX_BATCH_TURNS
from loom.models.bounds import JsonObject
from loom.models.common import AgentId, NamespacedRequest, PageOffset, PageSize, StrictModel, Timestamp

ThreadId = Annotated[
    str, Field(min_length=1, max_length=256, description="The thread's id (any string the client picks).")
]
MsgId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        description="The turn's id; without it the server derives one from thread, role and content.",
    ),
]
RoleName = Literal["user", "assistant", "system", "tool"]
Content = Annotated[str, Field(max_length=1_000_000)]
ShortText = Annotated[str, Field(max_length=256)]
Tokens = Annotated[int, Field(ge=0, le=4_294_967_295)]
Order = Literal["asc", "desc"]
AgentOrAll = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127})$",
        description='An agent of the namespace, or "*" for every agent.',
    ),
]
Title = Annotated[str, Field(max_length=500)]

_SINGLE_FIELDS = (
    "thread_id",
    "role",
    "content",
    "msg_id",
    "reasoning",
    "user_id",
    "run_id",
    "metadata",
    "tokens",
)


class TurnIn(StrictModel):
    thread_id: ThreadId
    role: RoleName
    content: Content
    msg_id: MsgId | None = None
    reasoning: Content = ""
    user_id: ShortText = ""
    run_id: ShortText = ""
    metadata: JsonObject = Field(default_factory=dict)
    tokens: Tokens | None = None


class AppendRequest(NamespacedRequest):
    """Either one turn (its fields at the top level) or `turns` (1 to 500), not both."""

    agent: AgentId = "default"
    thread_id: ThreadId | None = None
    role: RoleName | None = None
    content: Content | None = None
    msg_id: MsgId | None = None
    reasoning: Content | None = None
    user_id: ShortText | None = None
    run_id: ShortText | None = None
    metadata: JsonObject | None = None
    tokens: Tokens | None = None
    turns: list[TurnIn] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BATCH_TURNS,
        description="The batch form, for ingest: one result per turn, in order.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> AppendRequest:
        single = [f for f in _SINGLE_FIELDS if getattr(self, f) is not None]
        if self.turns is not None:
            if single:
                raise ValueError(
                    "give either one turn (thread_id, role, content, ...) or turns: [...], not both "
                    f"(found {', '.join(single)} beside turns)"
                )
        else:
            missing = [f for f in ("thread_id", "role", "content") if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"one turn needs thread_id, role and content (missing {', '.join(missing)}); "
                    "or send turns: [...] for a batch"
                )
        return self

    @property
    def is_batch(self) -> bool:
        return self.turns is not None

    def each_turn(self) -> list[TurnIn]:
        """The turns as the op takes them: the batch, or the one turn given at the top level.

        The one turn was checked field by field when the request was; it is built
        without a second pass (this is the hottest route), its unset fields defaulted."""
        if self.turns is not None:
            return self.turns
        given = {f: v for f in _SINGLE_FIELDS if (v := getattr(self, f)) is not None}
        return [TurnIn.model_construct(**given)]


class AppendTurnResult(BaseModel):
    thread_id: str
    msg_id: str
    role: str
    stored: bool = Field(description="False when nothing was kept; `reason` says why.")
    reason: Literal["logging_disabled", "duplicate", "deleted"] | None = Field(
        None,
        description="logging_disabled: the namespace does not record; duplicate: this agent's "
        "(thread_id, msg_id) already landed; deleted: the turn was removed while it was embedded.",
    )
    embedding: str = Field(
        description='"embedded", "failed", or "skipped:<why>" (role, high_sensitivity, empty, '
        "or the reason nothing was stored)."
    )
    embedding_error: str | None = Field(
        None, description="Why the embed failed (the embedding row records it too)."
    )


class AppendResponse(AppendTurnResult):
    namespace: str
    agent: str


class AppendBatchResponse(BaseModel):
    namespace: str
    agent: str
    stored: int = Field(description="How many of the turns were stored.")
    results: list[AppendTurnResult]


class CreateRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId | None = Field(None, description="Omit to have one generated.")
    title: Title | None = None
    metadata: JsonObject | None = None
    run_id: ShortText | None = None


class UpdateRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    title: Title | None = None
    metadata: JsonObject | None = Field(
        None, description="Replaces the thread's metadata, and so a title_refused mark."
    )
    run_id: ShortText | None = None


class ThreadOut(BaseModel):
    thread_id: str
    agent: str
    title: str
    metadata: dict[str, Any]
    run_id: str
    created_at: Timestamp | None
    updated_at: Timestamp | None
    turns: int = Field(0, description="Live turns in the thread.")
    last_ts: Timestamp | None = None


class CreateResponse(ThreadOut):
    created: bool = Field(description="False when the thread existed: the given fields were attached to it.")


class ThreadsRequest(NamespacedRequest):
    agent: AgentOrAll = "default"
    window_days: int = Field(30, ge=1, le=36_500, description="Threads active in the last N days.")
    limit: PageSize = 50
    offset: PageOffset = 0


class ThreadSummaryOut(BaseModel):
    thread_id: str
    agent: str
    title: str = Field(description="Empty when untitled or when the title reads as high.")
    excerpt: str = Field(description="The start of the last turn; empty when it reads as high.")
    last_ts: Timestamp
    last_role: str
    last_msg_id: str
    run_id: str
    created_at: Timestamp | None


class ThreadsResponse(BaseModel):
    threads: list[ThreadSummaryOut]
    limit: int
    offset: int
    has_more: bool


class MessageOut(BaseModel):
    msg_id: str
    ts: Timestamp
    role: str
    content: str
    reasoning: str
    user_id: str
    run_id: str
    metadata: dict[str, Any]
    tokens: int | None
    high_sensitivity: bool
    is_summary: bool
    is_saved: bool
    saved_at: Timestamp | None
    embedding: str | None = Field(
        None,
        description='With include_embedding: "embedded", "failed:<code>", "pending", "removed" '
        'or "not_indexed" (system and tool turns, and turns that read as high).',
    )


class GetRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    include_messages: bool = Field(
        True,
        description="The first page of the thread's turns comes with it (`limit`, oldest first; "
        '`order: "desc"` for the tail); false: the thread alone, `messages: []`.',
    )
    include_embedding: bool = Field(
        False, description="Each message's embedding state (with include_messages)."
    )
    order: Order = Field("asc", description='"desc" pages from the newest turn back (the tail).')
    limit: PageSize = 50
    cursor: str | None = Field(None, max_length=4096)


class GetResponse(BaseModel):
    thread: ThreadOut
    messages: list[MessageOut] = Field(
        default_factory=list, description="A page of the turns; empty with `include_messages: false`."
    )
    next_cursor: str | None = Field(None, description="Pass it back as `cursor` for the next page.")


class ListRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    run_id: ShortText | None = Field(None, description="Only the turns of this run.")
    order: Order = "asc"
    limit: PageSize = 50
    cursor: str | None = Field(None, max_length=4096, description="next_cursor of the previous page.")


class ListResponse(BaseModel):
    messages: list[MessageOut]
    next_cursor: str | None = None


class ReembedRequest(NamespacedRequest):
    thread_id: ThreadId | None = Field(None, description="Only this thread's rows.")


class ReembedResponse(BaseModel):
    namespace: str
    scanned: int
    reembedded: int
    skipped_tombstoned: int
    skipped_high: int
    skipped_changed: int
    failed: int
    errors: list[str]


class HighTurnsRequest(NamespacedRequest):
    limit: PageSize = 50
    offset: PageOffset = 0


class HighTurnOut(BaseModel):
    agent: str
    thread_id: str
    msg_id: str
    role: str
    ts: Timestamp
    saved_only: bool = Field(description="Stored by conversation.save_message alone (not in the transcript).")
    user_id: str
    kinds: list[str] = Field(
        description="The kinds of high shape found (api_key, password, ...); never the text."
    )


class HighTurnsResponse(BaseModel):
    turns: list[HighTurnOut]
    limit: int
    offset: int
    has_more: bool
