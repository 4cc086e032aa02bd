"""import.start, import.write and import.status (admin; a token bound to one user or
session is refused).

A client reads the source file and sends its records in numbered batches:

- import.start names the job: its namespace, the file's fingerprint, its format and the
  options (a hash of them is the job id). A job that is running or stopped is resumed
  (the answer says where: `next_seq` and the client's own `position`); one that is
  done starts over (an import of the same file again: every turn answers duplicate).
- import.write commits one batch: its records are written (loom.ops.portability.records)
  and only then does the job's row move to the next batch, so a client or server that
  stops loses at most the batch in flight, which the next run sends again (every write
  is idempotent). A batch already committed (a retry) writes nothing; one out of order
  is a 409. A batch that breaks a rule is refused whole (422, its field naming the
  record: `records.N...`), nothing of it written. `final` ends the job, done or stopped
  (the client stops at a bad record when asked to).
- import.status answers one job or the namespace's latest, with the background
  embedding's progress (loom.ops.portability.embedding).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import Conflict, Forbidden, NotFound
from loom.models import portability as lines
from loom.ops.portability import embedding, windows
from loom.ops.portability.records import Target, apply
from loom.services import Services
from loom.store import portability as store

RUNNING, DONE, STOPPED = "running", "done", "stopped"
# How far past its latest batch an import's window reaches while it runs: its inserts
# land within it (the window is closed at its real end when the job ends).
WINDOW_AHEAD = timedelta(minutes=10)
STATUS_LIMIT = 20


def _admin(who: Principal) -> None:
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot import", rule="read_scope")


def job_id_of(namespace: str, fingerprint: str, fmt: str, options: dict[str, Any]) -> str:
    """The job an import names: its namespace, file, format and where its records go (not
    what to do at a bad record: an import stopped at one resumes with --on-error skip)."""
    mapping = {k: v for k, v in options.items() if v and k != "on_error"}
    basis = json.dumps([namespace, fingerprint, fmt, mapping], sort_keys=True, separators=(",", ":"))
    return "imp-" + hashlib.sha256(basis.encode()).hexdigest()[:24]


async def start(
    svc: Services,
    who: Principal,
    namespace: str,
    source: str,
    fingerprint: str,
    fmt: str,
    options: dict[str, Any],
) -> store.Job:
    _admin(who)
    ns = who.namespace(namespace)
    job_id = job_id_of(ns, fingerprint, fmt, options)
    found = await svc.run(store.job, svc.ch, ns, job_id)
    now = utcnow()
    if found is not None and found.state != DONE:
        job = replace(found, state=RUNNING, updated_at=now, finished_at=None, version=next_version())
    else:
        at = await svc.run(store.server_now, svc.ch)
        job = store.Job(
            namespace=ns,
            job_id=job_id,
            source=source,
            format=fmt,
            options=options,
            token_id=found.token_id if found is not None else who.token_id,
            state=RUNNING,
            next_seq=0,
            position="",
            units=0,
            # A job started over keeps the count of turns it left to embed (its embedding's
            # counts go on from there); the rest starts from nothing.
            counts={"deferred": int(found.counts.get("deferred", 0))} if found is not None else {},
            errors=[],
            # A job started over keeps its window's start: its embedding goes on through it.
            window_start=found.window_start if found is not None else at,
            window_end=found.window_end if found is not None else at,
            landed_until=found.landed_until if found is not None else at,
            started_at=now,
            updated_at=now,
            version=next_version(),
        )
    await svc.run(store.put, svc.ch, job)
    return job


@dataclass
class Written:
    job: store.Job
    committed: bool
    batch: dict[str, int]


async def _job(svc: Services, who: Principal, job_id: str) -> store.Job:
    job = await svc.run(store.job_by_id, svc.ch, job_id)
    if job is None or job.namespace not in who.namespaces:
        raise NotFound("no such import job", field="job_id")  # another namespace's is no one's
    return job


async def write(
    svc: Services,
    who: Principal,
    job_id: str,
    seq: int,
    position: str,
    records: Sequence[lines.Record],
    skipped: Sequence[lines.SkippedRecord],
    units: int,
    final: str | None,
) -> Written:
    _admin(who)
    job = await _job(svc, who, job_id)
    if seq < job.next_seq:
        return Written(job, False, {})  # committed before: a retry of a batch that landed
    if job.state == DONE:
        raise Conflict("the import is done; import.start starts it over", field="job_id", rule="job_done")
    if seq > job.next_seq:
        raise Conflict(
            f"batch {seq} is out of order: the job expects {job.next_seq}", field="seq", rule="order"
        )
    if any(r.kind == "turn" for r in records):
        # Before any insert: the recovery pass must leave this import's turns to it.
        end = (await svc.run(store.server_now, svc.ch)) + WINDOW_AHEAD
        job = replace(job, window_end=max(_naive(job.window_end), _naive(end)))
        await windows.put(
            svc.redis, job.job_id, job.namespace, job.token_id, job.window_start, job.window_end
        )
    target = Target(job.namespace, job.token_id, utcnow())
    batch = await apply(svc, target, records)
    # Records the reader left out; the one an import stopped at is not one of them.
    batch["stopped_at" if final == STOPPED else "skipped"] += len(skipped)
    job = _committed(job, batch, skipped, seq, position, units)
    # The store's clock now: every turn of this batch has landed by then (what the
    # background embedding reads up to).
    job.landed_until = _naive(await svc.run(store.server_now, svc.ch))
    if final is not None:
        job.state, job.finished_at = final, utcnow()
        job.window_end = job.landed_until  # its last turns have landed: the window ends
        if job.counts.get("deferred"):
            await windows.put(
                svc.redis, job.job_id, job.namespace, job.token_id, job.window_start, job.window_end
            )
    await svc.run(store.put, svc.ch, job)
    if batch.get("deferred") or (final is not None and job.counts.get("deferred")):
        await _embedding_pending(svc, job)
    return Written(job, True, dict(batch))


def _naive(at: datetime) -> datetime:
    return at.replace(tzinfo=None) if at.tzinfo else at


def _committed(
    job: store.Job,
    batch: Counter[str],
    skipped: Sequence[lines.SkippedRecord],
    seq: int,
    position: str,
    units: int,
) -> store.Job:
    counts = Counter(job.counts)
    counts.update(batch)
    errors = list(job.errors)
    for s in skipped:
        e = {"pos": s.pos, "message": s.message}
        if len(errors) < lines.MAX_ERRORS_KEPT and e not in errors:  # a resumed run meets it again
            errors.append(e)
    return replace(
        job,
        next_seq=seq + 1,
        position=position,
        units=job.units + units,
        counts=dict(counts),
        errors=errors,
        updated_at=utcnow(),
        version=next_version(),
    )


async def _embedding_pending(svc: Services, job: store.Job) -> None:
    """The import has turns to embed: its background pass is (again) not done, and a run
    is asked for (one already going makes that a no-op)."""
    row = await svc.run(store.embedding, svc.ch, job.namespace, job.job_id)
    if row is None or row.state == embedding.DONE:
        fresh = store.Embedding(
            namespace=job.namespace,
            job_id=job.job_id,
            state=embedding.PENDING,
            position=row.position if row is not None else {},
            counts=row.counts if row is not None else {},
            updated_at=utcnow(),
            version=next_version(),
        )
        await svc.run(store.put_embedding, svc.ch, fresh)
    await embedding.enqueue(svc, job.job_id)


@dataclass
class Status:
    job: store.Job
    embedding: store.Embedding | None


async def status(svc: Services, who: Principal, namespace: str | None, job_id: str | None) -> list[Status]:
    _admin(who)
    if job_id is not None:
        found = [await _job(svc, who, job_id)]
    else:
        nss = [who.namespace(namespace)] if namespace else list(who.namespaces)
        found = await svc.run(store.jobs, svc.ch, nss, STATUS_LIMIT)
    rows = await svc.run(store.embeddings, svc.ch, [(j.namespace, j.job_id) for j in found])
    return [Status(j, rows.get((j.namespace, j.job_id))) for j in found]


def embedding_progress(s: Status) -> dict[str, Any]:
    to_embed = int(s.job.counts.get("deferred", 0))
    e = s.embedding
    counts = e.counts if e is not None else {}
    state = "none" if not to_embed else (e.state if e is not None else embedding.PENDING)
    return {
        "state": state,
        "to_embed": to_embed,
        "embedded": int(counts.get("embedded", 0)),
        "failed": int(counts.get("failed", 0)),
        "skipped": int(counts.get("skipped", 0)),
        "rate_per_s": float(e.rate) if e is not None else 0.0,
    }
