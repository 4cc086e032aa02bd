"""memory.job_status (viewer): where a deferred extraction is.

`memory.set_from_messages` with `defer: true` writes the job's status before it enqueues
the job (`queued`); the worker's `memory_extract` writes `running` when it starts and
`done` (with the counts: extracted, added, updated, deleted, left, and a `reason` when
nothing could be extracted from readable text: `nothing_readable`, `subject_erased`) or
`failed` (a stable code, never an exception's text: `llm_not_configured`, `llm_failed`,
`backend_unavailable`, `internal_error`) when it ends.

The status is a Redis string (JSON) under the namespace (`loom:memory:job:<ns>:<job>`),
so it survives a worker's restart (a job arq runs again writes `running` again, then its
end) and a job of another namespace is simply not found (404, as an unknown id). It
lives a day after its last change (STATUS_TTL_S): long enough to poll, short enough
that finished jobs do not pile up. It holds ids, times and counts only, no text; a
namespace erasure removes it with the namespace's other keys. A token pinned to one
user sees its own user's jobs only (another user's is 404 too); one pinned to a session,
that session's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from loom import failures, redis_keys
from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import NotFound
from loom.ops.webhooks import events, registry
from loom.services import Services
from loom.store.memories import Scope

STATUS_TTL_S = 86_400
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
# An extraction's `reason` that means it could not run (failed) rather than that it ran
# and found nothing to do (done).
FAILED_REASONS = frozenset({"llm_not_configured", "llm_failed"})


@dataclass
class Counts:
    extracted: int = 0
    added: int = 0
    updated: int = 0
    deleted: int = 0
    left: int = 0


@dataclass
class JobStatus:
    job_id: str
    state: str
    user_id: str
    session_id: str = ""
    run_id: str = ""
    queued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    attempts: int = 0
    extraction_id: str | None = None
    counts: Counts | None = None
    reason: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> JobStatus:
        data: dict[str, Any] = json.loads(raw)
        counts = data.pop("counts", None)
        return cls(**data, counts=Counts(**counts) if counts else None)


def counts_of(extracted: int, actions: list[str]) -> Counts:
    """The counts of an extraction's decisions (add / update / delete / leave)."""
    return Counts(
        extracted=extracted,
        added=actions.count("add"),
        updated=actions.count("update"),
        deleted=actions.count("delete"),
        left=actions.count("leave"),
    )


async def _write(svc: Services, namespace: str, status: JobStatus) -> None:
    await svc.redis.set(redis_keys.memory_job(namespace, status.job_id), status.to_json(), ex=STATUS_TTL_S)


async def _read(svc: Services, namespace: str, job_id: str) -> JobStatus | None:
    raw = await svc.redis.get(redis_keys.memory_job(namespace, job_id))
    return JobStatus.from_json(raw) if raw is not None else None


async def queued(svc: Services, scope: Scope, job_id: str) -> None:
    """Before the job is enqueued (so the worker's `running` can never be overwritten)."""
    status = JobStatus(
        job_id,
        QUEUED,
        scope.user_id,
        scope.session_id,
        scope.run_id,
        queued_at=utcnow().isoformat(),
    )
    await _write(svc, scope.namespace, status)


async def _current(svc: Services, scope: Scope, job_id: str) -> JobStatus:
    found = await _read(svc, scope.namespace, job_id)
    if found is None:  # expired, or enqueued by a build that wrote none
        found = JobStatus(job_id, QUEUED, scope.user_id, scope.session_id, scope.run_id)
    return found


async def running(svc: Services, scope: Scope, job_id: str) -> None:
    status = await _current(svc, scope, job_id)
    status.state, status.started_at = RUNNING, utcnow().isoformat()
    status.attempts += 1
    status.finished_at = status.reason = None
    await _write(svc, scope.namespace, status)


async def finished(
    svc: Services, scope: Scope, job_id: str, *, extraction_id: str | None, counts: Counts, reason: str | None
) -> None:
    status = await _current(svc, scope, job_id)
    status.finished_at = utcnow().isoformat()
    status.extraction_id, status.reason = extraction_id, reason
    if reason in FAILED_REASONS:
        status.state, status.counts = FAILED, None
    else:
        status.state, status.counts = DONE, counts
    await _write(svc, scope.namespace, status)


async def crashed(svc: Services, scope: Scope, job_id: str, exc: BaseException) -> str:
    """The job raised: `failed` with the stable code of the failure, which it answers (the
    exception's text goes to the log only, by the caller)."""
    status = await _current(svc, scope, job_id)
    status.state, status.finished_at = FAILED, utcnow().isoformat()
    reason = failures.code_of(failures.failure(exc)) or failures.INTERNAL_ERROR
    status.reason, status.counts = reason, None
    await _write(svc, scope.namespace, status)
    return reason


async def announce(
    svc: Services,
    scope: Scope,
    *,
    extraction_id: str | None,
    counts: Counts,
    reason: str | None,
    evidence: int,
    job_id: str | None,
) -> None:
    """The `memory.extracted` webhook event, for an extraction that ran to its end
    (ids and counts only)."""
    if extraction_id is None or reason is not None:
        return
    data: dict[str, Any] = {
        "user_id": scope.user_id,
        "session_id": scope.session_id,
        "run_id": scope.run_id,
        "extraction_id": extraction_id,
        "job_id": job_id,
        "evidence": evidence,
        **asdict(counts),
    }
    await events.emit(svc, scope.namespace, registry.MEMORY_EXTRACTED, data)


def _acts_for(who: Principal, status: JobStatus) -> bool:
    """Whether a token pinned to a user (or session) acts for the job's scope."""
    if status.user_id != who.read_user_id:
        return False
    return who.read_scope != "own_session" or status.session_id == who.read_session_id


async def job_status(svc: Services, who: Principal, namespace: str, job_id: str) -> JobStatus:
    """memory.job_status (viewer): a deferred extraction's state. Unknown, expired, of
    another namespace, or of a user (or session) a pinned token does not act for: 404."""
    who.require_role(Role.viewer)
    ns = who.namespace(namespace)
    found = await _read(svc, ns, job_id) if job_id and ":" not in job_id else None
    if found is not None and who.bounded and not _acts_for(who, found):
        found = None
    if found is None:
        raise NotFound(f"no memory extraction job {job_id!r} in this namespace", field="job_id")
    return found


__all__ = [
    "DONE",
    "FAILED",
    "QUEUED",
    "RUNNING",
    "STATUS_TTL_S",
    "Counts",
    "announce",
    "JobStatus",
    "counts_of",
    "crashed",
    "finished",
    "job_status",
    "queued",
    "running",
]
