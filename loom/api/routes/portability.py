"""Routes of import.start / import.write / import.status and export.start (admin;
tokens bound to one user or session are refused)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi.responses import StreamingResponse

from loom.api.deps import Caller, Svc, op_router
from loom.models.errors import error_responses
from loom.models.portability import (
    ExportStartRequest,
    ImportJobOut,
    ImportStartRequest,
    ImportStatusRequest,
    ImportStatusResponse,
    ImportWriteRequest,
    ImportWriteResponse,
)
from loom.ops.portability import exporting, importing

router = op_router("import and export")


def _out(s: importing.Status) -> ImportJobOut:
    return ImportJobOut.model_validate(asdict(s.job) | {"embedding": importing.embedding_progress(s)})


@router.post("/import.start", response_model=ImportJobOut)
async def import_start(body: ImportStartRequest, who: Caller, svc: Svc) -> ImportJobOut:
    """Start an import of one file (or resume it: the same namespace, file fingerprint,
    format and options name the same job). The answer says which batch to send next
    (`next_seq`) and where the source was read up to (`position`)."""
    options = body.options.model_dump(exclude_none=True)
    job = await importing.start(svc, who, body.namespace, body.source, body.fingerprint, body.format, options)
    return _out(importing.Status(job, None))


@router.post("/import.write", response_model=ImportWriteResponse, responses=error_responses(404, 409))
async def import_write(body: ImportWriteRequest, who: Caller, svc: Svc) -> ImportWriteResponse:
    """Commit one batch of records (`seq`: the job's `next_seq`). Turns go through
    conversation.append's write path (recording switch, duplicates, sensitivity) and are
    embedded in the background; other rows are written only where the namespace holds
    none of their key. A batch committed before writes nothing (`committed: false`); a
    record that breaks a rule refuses the whole batch (422 naming `records.N`)."""
    w = await importing.write(
        svc, who, body.job_id, body.seq, body.position, body.records, body.errors, body.units, body.final
    )
    return ImportWriteResponse(job=_out(importing.Status(w.job, None)), committed=w.committed, batch=w.batch)


@router.post("/import.status", response_model=ImportStatusResponse, responses=error_responses(404))
async def import_status(body: ImportStatusRequest, who: Caller, svc: Svc) -> ImportStatusResponse:
    """One import job (`job_id`) or the latest of a namespace (or of the token's): its
    counts, errors with their file positions, and the background embedding's progress."""
    found = await importing.status(svc, who, body.namespace, body.job_id)
    return ImportStatusResponse(jobs=[_out(s) for s in found])


@router.post(
    "/export.start",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
async def export_start(body: ExportStartRequest, who: Caller, svc: Svc) -> StreamingResponse:
    """A namespace (or one user's rows, or one thread) in Loom's export format
    (docs/export-format.md), streamed as NDJSON with `Content-Encoding: gzip` (default),
    `zstd` or none: a header line, the rows kind by kind (tombstones and redactions shown
    as such), an end line with the row count and the SHA-256 of the body lines. Saved as
    it comes, the bytes are a .ndjson.gz (or .zst) file."""
    export = exporting.prepare(
        who,
        body.namespace,
        user_id=body.user_id,
        thread_id=body.thread_id,
        agent=body.thread_agent,
        compression=body.compression,
    )
    encoding = {} if body.compression == "none" else {"Content-Encoding": body.compression}
    return StreamingResponse(
        exporting.stream(svc, export), media_type="application/x-ndjson", headers=encoding
    )
