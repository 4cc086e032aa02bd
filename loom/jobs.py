"""The payload of every background job: what the API enqueues and a worker reads.

The API and the workers are separate processes and, during a rolling deploy, of
different builds. So a job's payload is a typed model with a version, read by name
(never by position), validated where it is read:

* a field renamed, dropped, added or of another type between the enqueuing build and
  the reading one fails the job loudly (:class:`PayloadRefused` naming the field),
  instead of a reordered tuple silently putting a thread id where a msg_id belongs;
* a payload of a version this build does not read (or with none: the positional
  payloads of earlier builds) is refused the same way, naming the job and both
  versions.

Change a payload's fields only with a new version, and read the old one until no
process enqueues it any more.

On the wire a payload is the model's plain dump (a dict of strings, numbers, datetimes
and lists: arq pickles it). The append path's embedding job is on every append's
critical path: the API builds it without validation (:meth:`pydantic.BaseModel.model_construct`,
its values are the API's own) and the worker validates it once
(both measured: bench/results/2026-12-01-2320-job-payload.txt).

Who enqueues each job:

| job (function)    | payload           | enqueued by                                   |
|-------------------|-------------------|-----------------------------------------------|
| embed_turns       | EmbedTurnsJob     | the append flush (loom.ops.embedding.client.EmbedClient) |
| reembed_rows      | ReembedRowsJob    | conversation.reembed (the same client)        |
| erasure_remove    | ErasureRemoveJob  | erasure.request (loom.ops.erasure.requesting) |
| compact_thread    | CompactThreadJob  | conversation.compact (loom.ops.conversation.lifecycle.compacting) |
| memory_extract    | MemoryExtractJob  | memory.set_from_messages with defer (loom.ops.memory.extraction) |
| webhook_deliver   | WebhookDeliverJob | an event's emitter, and a failed attempt's retry (loom.ops.webhooks) |
| import_embed      | ImportEmbedJob    | import.write, the job itself (work left), the worker's import tick (loom.ops.portability.embedding) |
| recover_embeddings| none (arq cron)   | every worker's cron                           |
| conversation_titler| none (arq cron)  | every worker's cron                           |
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from loom.store.keys import EmbRef, TurnRef

EMBED_TURNS = "embed_turns"
REEMBED_ROWS = "reembed_rows"
ERASURE_REMOVE = "erasure_remove"
COMPACT_THREAD = "compact_thread"
MEMORY_EXTRACT = "memory_extract"
WEBHOOK_DELIVER = "webhook_deliver"
IMPORT_EMBED = "import_embed"


class PayloadRefused(ValueError):
    """A job payload this build cannot read (another version, or none)."""


@dataclass(frozen=True)
class EmbedTurn(TurnRef):
    """One stored turn to embed: the copy its embedding row will serve, and its text."""

    text: str
    is_summary: bool = False
    speaker: str = ""  # metadata.speaker (transcript_postings.speaker_of): the model's prefix


@dataclass(frozen=True)
class ReembedItem(EmbRef):
    """One embedding row to embed again from the text it keeps."""

    text: str


class JobPayload(BaseModel):
    """What every payload carries: its version. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    JOB: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    v: int


class Replied(JobPayload):
    """A job whose API process awaits its reply: the job's id and the reply list."""

    job: str = ""
    reply: str = ""


class EmbedTurnsJob(Replied):
    """Embed the turns one append flush stored (or is storing, behind `gate`)."""

    JOB: ClassVar[str] = EMBED_TURNS
    turns: list[EmbedTurn]
    at: int = 0  # the enqueue stamp (ns), from which the worker's write deadline runs
    gate: str | None = None  # the insert gate the worker waits on before writing


class ReembedRowsJob(Replied):
    """Re-embed a page of embedding rows from the text each keeps."""

    JOB: ClassVar[str] = REEMBED_ROWS
    rows: list[ReembedItem]


class ErasureRemoveJob(JobPayload):
    """Remove an erasure's rows from disk, resuming at its first step not done."""

    JOB: ClassVar[str] = ERASURE_REMOVE
    erasure_id: str


class CompactThreadJob(JobPayload):
    """Compact one agent's thread (conversation.compact; the API awaits the result)."""

    JOB: ClassVar[str] = COMPACT_THREAD
    namespace: str
    agent: str
    thread_id: str
    keep_recent: int
    min_to_compact: int


class MemoryExtractJob(JobPayload):
    """Extract facts from stored evidence for one memory scope (memory.set_from_messages, defer)."""

    JOB: ClassVar[str] = MEMORY_EXTRACT
    namespace: str
    user_id: str
    session_id: str
    run_id: str
    evidence_ids: list[str]


class WebhookDeliverJob(JobPayload):
    """POST one event to one webhook (attempt `attempt`; a failed one enqueues the next).
    `body` is the event's JSON as sent: ids and counts only, never a turn's or fact's text."""

    JOB: ClassVar[str] = WEBHOOK_DELIVER
    namespace: str
    webhook_id: str
    event: str
    event_id: str
    event_at: datetime
    body: str
    attempt: int


class ImportEmbedJob(JobPayload):
    """Embed the turns an import stored (one run of its background embedding)."""

    JOB: ClassVar[str] = IMPORT_EMBED
    job_id: str


P = TypeVar("P", bound=JobPayload)


def build(model: type[P], **fields: Any) -> dict[str, Any]:
    """The wire form of a payload built by this process from its own (typed) values:
    no validation on the enqueuing side (the reader validates)."""
    return model.model_construct(v=model.VERSION, **fields).model_dump()


def read(model: type[P], payload: Any) -> P:
    """The payload as `model`, or PayloadRefused: another version (or none), or a field
    missing, unknown or of another type. The message names the job, the versions and
    the fields, never a value (a payload carries turns' text, which no log may hold)."""
    version = payload.get("v") if isinstance(payload, dict) else None
    if version != model.VERSION:
        raise PayloadRefused(
            f"{model.JOB} payload version {version!r} refused: this worker reads version {model.VERSION} "
            "(the enqueuing process runs another build)"
        )
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(part) for part in e['loc'])}: {e['type']}" for e in exc.errors())
        raise PayloadRefused(f"{model.JOB} payload (version {version}) refused: {problems}") from None
