"""Requests and responses of conversation.delete, the erasure ops and retention.show."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from loom.models.common import AgentId, Namespace, NamespacedRequest, RequestBody, Timestamp
from loom.models.conversation.reading import MsgId, ThreadId


class DeleteRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    confirm_thread_id: str = Field(max_length=256, description="Must repeat thread_id exactly (else 422).")


class DeleteResponse(BaseModel):
    thread_id: str
    agent: str
    deleted: bool
    turns_tombstoned: int
    thread_tombstoned: bool
    embeddings_tombstoned: int
    embeddings_handed_over: int


class DeleteMessageRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId


class TableCountOut(BaseModel):
    written: int = Field(description="New row versions written (tombstones, rewritten texts, hand-overs).")
    removed: int = Field(description="Older row versions removed from disk.")


class RemovalReceipt(BaseModel):
    """What a removal of one turn did; never any removed text."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    found: bool = Field(description="False when nothing was left to remove (asked again).")
    tables: dict[str, TableCountOut]
    embedding: str = Field(
        description="What became of the turn's embedding row: none, tombstoned, handed_over, "
        "kept_by_other_agent, embedded or failed."
    )
    summaries_tombstoned: int = Field(description="Compaction summaries built from the turn, tombstoned.")
    turns_restored: int = Field(description="Turns those summaries had replaced, live again.")
    at: Timestamp | None = None
    by: str = Field(description="The token id that asked.")
    unreadable_ms: float = Field(description="From the op's start until no read found the old text.")
    gone_ms: float = Field(description="From the op's start until no part file held it (0: not yet).")
    removal: str = Field(
        description="done: the older versions left the disk before the answer; pending: their removal "
        "was submitted (durable) and the engine finishes it."
    )


class DeleteMessageResponse(RemovalReceipt):
    deleted: bool = Field(description="The transcript row is gone (for an end-user token: a saved-only row).")
    unsaved: bool = Field(
        False,
        description="An end-user token's delete withdrew its own saved message, as "
        "conversation.unsave_message does; a recorded turn stays in the transcript.",
    )


class RedactRequest(NamespacedRequest):
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId
    spans: list[Annotated[str, Field(min_length=1, max_length=100_000)]] | None = Field(
        None, max_length=100, description="Exact texts to replace (every occurrence)."
    )
    ranges: list[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]] | None = Field(
        None, max_length=100, description="[start, end) character ranges of the turn's text to replace."
    )
    high: bool = Field(False, description="Replace every span that reads as high.")
    placeholder: str = Field(
        "[redacted]", min_length=1, max_length=64, description="What replaces each span."
    )


class RedactResponse(RemovalReceipt):
    redacted: bool
    placeholder: str
    spans: int = Field(description="How many (merged) spans were replaced.")
    high_sensitivity: bool = Field(description="The turn still reads as high (then it has no embedding).")


class ErasureRequest(RequestBody):
    user_id: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Erase this user's rows (give this or namespace_list).",
    )
    namespaces: list[Namespace] | None = Field(
        None,
        max_length=1000,
        description=(
            "For a user erasure: the namespaces to erase in (default: every namespace the token grants)."
        ),
    )
    namespace_list: list[Namespace] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description=("Erase everything of these namespaces (needs purge: true)."),
    )
    purge: bool = Field(
        False,
        description=(
            "A user erasure also removes the user's embedding rows from disk; required for namespace_list."
        ),
    )


class ErasureResponse(BaseModel):
    erasure_id: str
    kind: str
    state: str
    steps_total: int
    steps_done: int
    receipt: dict[str, Any]
    error: str = ""
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None


class ErasureStatusRequest(RequestBody):
    erasure_id: str = Field(min_length=1, max_length=64)


class ExportRequest(RequestBody):
    user_id: str = Field(min_length=1, max_length=256)
    namespaces: list[Namespace] | None = Field(None, max_length=1000)
    include_tombstoned: bool = True


class RetentionShowRequest(RequestBody):
    pass


class TableStorageOut(BaseModel):
    table: str
    engine: str
    ttl: str
    storage_policy: str
    volumes: list[str]


class TieringOut(BaseModel):
    warm_days: int
    applies: bool
    why: str


class RetentionShowResponse(BaseModel):
    retention_days: int
    tiering: TieringOut
    tables: list[TableStorageOut]
