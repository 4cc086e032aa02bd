"""Loom's export format (its lines) and the requests and answers of import.* and export.start.

The lines of an export and the records an import writes are the same models: an export's
body lines are sent back as import records unchanged, which is what makes an export of
a namespace, imported into an empty one and exported again, equal to the first (but for
the header's times and namespace). docs/export-format.md describes the format and
docs/export-format.schema.json is its JSON Schema, rendered from these models
(`python -m loom.portability.schema`; a test keeps the file current).

Every line names its `kind`. None carries the namespace (the header does), a version,
a vector or a token of the target: those belong to the Loom that holds the rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from loom.models.bounds import JsonObject
from loom.models.common import AgentId, NamespacedRequest, RequestBody, StrictModel, Timestamp
from loom.models.conversation.reading import Content, MsgId, RoleName, ShortText, ThreadId, Title, Tokens

Key = Annotated[str, Field(max_length=256)]
Word = Annotated[str, Field(max_length=64)]
Text = Annotated[str, Field(max_length=1_000_000)]
Ids = Annotated[list[Key], Field(max_length=1_000)]
Position = Annotated[str, Field(max_length=200, description="Where in the source file (for messages).")]
UInt32 = Annotated[int, Field(ge=0, le=4_294_967_295)]  # the column's ClickHouse type

FORMAT_NAME = "loom-export"
FORMAT_VERSION = 1
MAX_RECORDS = 2_000  # records in one import.write
MAX_ERRORS_KEPT = 20  # error messages a job keeps (the counts keep every one)


class TurnLine(StrictModel):
    """A transcript row: live, tombstoned (deleted, compacted, redacted-then-deleted: a
    deleted turn's text is already gone from the store, so it is exported empty) or a
    compaction summary (`is_summary`, `metadata.compacted_from`). A redacted turn holds
    its placeholder where the spans were, as stored."""

    kind: Literal["turn"]
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId
    ts: datetime | None = Field(None, description="The message time (default: when the import ran).")
    role: RoleName
    content: Content
    reasoning: Content = ""
    user_id: ShortText = ""
    run_id: ShortText = ""
    metadata: JsonObject = Field(default_factory=dict)
    tokens: Tokens | None = None
    high_sensitivity: bool = Field(
        False, description="The screen's verdict when exported; an import screens the text again."
    )
    is_summary: bool = False
    is_saved: bool = False
    saved_at: datetime | None = None
    origin: Literal["recorded", "saved"] = "recorded"
    tombstoned: bool = False
    tombstoned_at: datetime | None = None
    tombstone_reason: Word = ""
    pos: Position = Field("", description="Import only: where the record is in its source file.")


class ThreadLine(StrictModel):
    kind: Literal["thread"]
    agent: AgentId = "default"
    thread_id: ThreadId
    title: Title = ""
    metadata: JsonObject = Field(default_factory=dict)
    run_id: ShortText = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    tombstoned: bool = False
    pos: Position = ""


class NamespaceLine(StrictModel):
    """The namespace's own settings. An import applies them only to a namespace that has
    none yet (never over its owner's choice)."""

    kind: Literal["namespace"]
    conversation_logging_enabled: bool = False
    model_calls_enabled: bool = True
    extraction_policy: Key = ""
    pos: Position = ""


class RedactionLine(StrictModel):
    """The record of one turn redacted or deleted one by one (never the removed text)."""

    kind: Literal["redaction"]
    agent: AgentId = "default"
    thread_id: ThreadId
    msg_id: MsgId
    user_id: ShortText = ""
    action: Literal["redacted", "deleted"]
    placeholder: Annotated[str, Field(max_length=64)] = ""
    spans: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    token_id: Key = Field("", description="The token that asked, in the Loom the row comes from.")
    redacted_at: datetime
    pos: Position = ""


class BriefLine(StrictModel):
    kind: Literal["brief"]
    brief_key: Key
    project: Key = ""
    branch: Key = ""
    session_id: Key = ""
    user_id: ShortText = ""
    agent: AgentId = "default"
    revision: UInt32
    sections: JsonObject = Field(default_factory=dict)
    author: Word = ""
    last_session_id: Key = ""
    last_event_cursor: Key = ""
    last_summary: Text = ""
    created_at: datetime
    updated_at: datetime
    deleted: bool = False
    pos: Position = ""


class BriefRevisionLine(StrictModel):
    kind: Literal["brief_revision"]
    brief_key: Key
    revision: UInt32
    project: Key = ""
    branch: Key = ""
    session_id: Key = ""
    user_id: ShortText = ""
    agent: AgentId = "default"
    token_id: Key = ""
    sections: JsonObject = Field(default_factory=dict)
    author: Word = ""
    event_cursor: Key = ""
    last_summary: Text = ""
    created_at: datetime
    pos: Position = ""


class MemoryLine(StrictModel):
    """A fact as it stands (its newest version): live, forgotten (`tombstoned`) or
    superseded (`valid_until`, `superseded_by`); its history is the chain of facts it
    supersedes and the decisions that name it. Never its vector."""

    kind: Literal["memory"]
    user_id: ShortText
    memory_id: Key
    session_id: Key = ""
    run_id: ShortText = ""
    fact_kind: Word = ""
    key: Key = ""
    text: Text
    source: Word = ""
    evidence_ids: Ids = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    tombstoned: bool = False
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    supersedes: Key = ""
    superseded_by: Key = ""
    lineage: Key = ""
    pos: Position = ""


class EvidenceLine(StrictModel):
    kind: Literal["memory_evidence"]
    user_id: ShortText
    evidence_id: Key
    session_id: Key = ""
    run_id: ShortText = ""
    source: Word = ""
    msg_id: Key = ""
    role: Word = ""
    content: Text = ""
    high_sensitivity: bool = False
    ts: datetime
    created_at: datetime
    tombstoned: bool = False
    pos: Position = ""


class DecisionLine(StrictModel):
    kind: Literal["memory_decision"]
    user_id: ShortText
    extraction_id: Key
    seq: UInt32
    action: Word
    memory_id: Key = ""
    text: Text = ""
    evidence_ids: Ids = Field(default_factory=list)
    created_at: datetime
    pos: Position = ""


Record = Annotated[
    TurnLine
    | ThreadLine
    | NamespaceLine
    | RedactionLine
    | BriefLine
    | BriefRevisionLine
    | MemoryLine
    | EvidenceLine
    | DecisionLine,
    Field(discriminator="kind"),
]
RECORD_KINDS = (
    "namespace",
    "thread",
    "turn",
    "redaction",
    "brief",
    "brief_revision",
    "memory",
    "memory_evidence",
    "memory_decision",
)


class ExportScope(StrictModel):
    user_id: ShortText | None = None
    thread_id: ThreadId | None = None
    agent: AgentId | None = None


class HeaderLine(StrictModel):
    """The first line of an export."""

    kind: Literal["header"]
    format: Literal["loom-export"]
    format_version: int = Field(
        description="Raised on any change a reader of the previous one would misread."
    )
    loom_version: str
    exported_at: datetime
    namespace: str
    scope: ExportScope
    counts: dict[str, int] = Field(description="Rows of each kind in the export.")


class EndLine(StrictModel):
    """The last line: how many body lines there were and the SHA-256 of their bytes
    (every line between the header and this one, newlines included), so that two
    exports of the same rows carry the same checksum."""

    kind: Literal["end"]
    rows: int
    sha256: str


# -- import ----------------------------------------------------------------------------

SourceFormat = Literal["chatgpt", "claude", "openai", "loom", "markdown", "json", "jsonl", "codex"]
OnError = Literal["stop", "skip"]


class ImportOptions(StrictModel):
    agent: AgentId | None = Field(
        None, description="The agent the turns are logged as (Loom exports: keep theirs)."
    )
    user_id: ShortText | None = Field(None, description="The user every imported turn belongs to.")
    thread_prefix: Annotated[str, Field(max_length=64)] = Field(
        "", description="Prefixed to derived thread ids."
    )
    thread_id: ThreadId | None = Field(None, description="Every turn into this one thread.")
    on_error: OnError = "stop"


class ImportStartRequest(NamespacedRequest):
    source: Annotated[str, Field(min_length=1, max_length=512)] = Field(description="The file's name.")
    fingerprint: Annotated[str, Field(min_length=8, max_length=128)] = Field(
        description="Identifies the file's content (the CLI: its size and a digest of its ends). "
        "The same file, namespace and options name the same job: it resumes."
    )
    format: SourceFormat
    options: ImportOptions = Field(default_factory=ImportOptions)


class SkippedRecord(StrictModel):
    pos: Position
    message: Annotated[str, Field(max_length=500)]


class ImportWriteRequest(RequestBody):
    job_id: Key
    seq: Annotated[int, Field(ge=0)] = Field(description="This batch's number: the job's next_seq.")
    position: Annotated[str, Field(max_length=200)] = Field(
        description="Where the source is read up to once this batch is in (opaque; answered by import.start)."
    )
    records: list[Record] = Field(default_factory=list, max_length=MAX_RECORDS)
    errors: list[SkippedRecord] = Field(
        default_factory=list, max_length=MAX_RECORDS, description="Bad records the reader skipped."
    )
    units: Annotated[int, Field(ge=0)] = Field(
        0, description="Source units (conversations, lines) this batch ends."
    )
    final: Literal["done", "stopped"] | None = Field(None, description="The last batch: the job ends so.")


class ImportStatusRequest(RequestBody):
    namespace: str | None = Field(None, max_length=128, description="List the namespace's jobs (no job_id).")
    job_id: Key | None = None


class EmbeddingProgress(BaseModel):
    state: str = Field(description="none | pending | running | done.")
    to_embed: int = Field(description="Imported turns waiting for, or given, a vector.")
    embedded: int
    failed: int
    skipped: int = Field(description="Found deleted or already embedded when their turn came.")
    rate_per_s: float = Field(description="Turns embedded a second over the job's last slice.")


class ImportJobOut(BaseModel):
    job_id: str
    namespace: str
    source: str
    format: str
    state: str = Field(description="running | done | stopped.")
    next_seq: int
    position: str
    units: int = Field(description="Source units (conversations, lines) read so far.")
    counts: dict[str, int] = Field(
        description="read, stored, duplicate, logging_disabled, high (stored, never embedded), "
        "skipped (bad records), and rows of each other kind written or already there."
    )
    errors: list[dict[str, str]] = Field(
        description=f"The first {MAX_ERRORS_KEPT} errors, each with its position."
    )
    embedding: EmbeddingProgress
    started_at: Timestamp
    updated_at: Timestamp
    finished_at: Timestamp | None = None


class ImportWriteResponse(BaseModel):
    job: ImportJobOut
    committed: bool = Field(description="False: this batch was committed before (a retry); nothing written.")
    batch: dict[str, int] = Field(description="What this batch did, as in counts.")


class ImportStatusResponse(BaseModel):
    jobs: list[ImportJobOut]


# -- export ----------------------------------------------------------------------------


class ExportStartRequest(NamespacedRequest):
    user_id: ShortText | None = Field(None, description="Only this user's rows.")
    thread_id: ThreadId | None = Field(
        None, description="Only this thread (of `thread_agent`, or every agent's)."
    )
    thread_agent: AgentId | None = Field(
        None, description="With thread_id: only this agent's copy of the thread."
    )
    compression: Literal["gzip", "zstd", "none"] = "gzip"


__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "RECORD_KINDS",
    "EndLine",
    "ExportStartRequest",
    "HeaderLine",
    "ImportStartRequest",
    "ImportStatusRequest",
    "ImportWriteRequest",
    "Record",
]


def line_kinds() -> dict[str, type[BaseModel]]:
    """Every line model by its kind (the header and the end line included)."""
    models: list[type[BaseModel]] = [
        HeaderLine,
        NamespaceLine,
        ThreadLine,
        TurnLine,
        RedactionLine,
        BriefLine,
        BriefRevisionLine,
        MemoryLine,
        EvidenceLine,
        DecisionLine,
        EndLine,
    ]
    out: dict[str, type[BaseModel]] = {}
    for m in models:
        kind: Any = m.model_fields["kind"].annotation
        out[kind.__args__[0]] = m
    return out
