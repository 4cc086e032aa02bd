"""erasure.request and erasure.status (admin), and the removal the worker runs.

By user (``user_id``, across the namespaces the token grants, or those listed): the
user's conversation rows (saved messages included) and their briefs are tombstoned,
and their embedding rows too (an embedding row another user's live copy shares passes
to that copy instead, as a delete passes it). The answer comes as soon as nothing of
the user is readable by any op; the rows are then removed from disk by a job on the
worker pool: the transcript rows (every version), their rows in the vector tables and
the saved-message indexes, the briefs; with ``purge: true`` the embedding rows as well
(otherwise they stay, as tombstones).

The user's thread rows go with them: a thread (agent, thread_id) the user has a turn in
and that is left with no live turn is tombstoned (title and metadata emptied) and removed;
one where other users' turns live on keeps its row with its title emptied (a title is
written from the thread's text), and its earlier versions are removed. An append of the
user racing the erasure is fenced (loom.store.fences): a turn stamped before the answer
erases itself wherever it lands; one stamped after it is new.

By ``namespace_list`` (``purge: true`` required): every row of those namespaces, in
every table, embedding rows included, is hidden at once (lightweight DELETE) and every
Redis key of those namespaces removed (turn claims, landed notes, search marks, the
recording cache, deletion fences, thread leases); the worker then rewrites the parts
without the rows.

Every erasure answers with a receipt: per table, rows tombstoned (or hidden) and
removed, the time, and a digest of the keys (per table, a sum of sipHash64 over the
keys, and one SHA-256 over all of it), so an operator can prove what was erased. The
removal is a sequence of idempotent steps whose progress is recorded after each one
(erasure.status reads it); a job killed halfway is run again by the pool and resumes
at the first step not recorded done, recounting nothing it already removed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from redis.asyncio import Redis

from loom import jobs, redis_keys
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import Forbidden, InvalidRequest, NotFound, Unavailable
from loom.leases import LeaseTimeout, under_thread_leases
from loom.ops.conversation.common import EMBED_CHARS
from loom.ops.conversation.lifecycle.deleting import handed_to, heir
from loom.ops.memory import erasing as memory_erasing
from loom.ops.webhooks import events as webhook_events
from loom.ops.webhooks import registry as webhook_registry
from loom.queue import QUEUE, wake_workers
from loom.services import Services
from loom.store import erasure as store
from loom.store import fences, recording_cache, search_marks

REMOVE_JOB = jobs.ERASURE_REMOVE
USER, NAMESPACES = "user", "namespaces"
REMOVING, DONE, FAILED = "removing", "done", "failed"


def _principal_namespaces(who: Principal, listed: Sequence[str] | None) -> list[str]:
    if not listed:
        return list(who.namespaces)
    return list(dict.fromkeys(who.namespace(n) for n in listed))


async def request(
    svc: Services,
    who: Principal,
    *,
    user_id: str | None,
    namespaces: Sequence[str] | None,
    namespace_list: Sequence[str] | None,
    purge: bool,
) -> store.Request:
    """erasure.request (admin): answers once nothing of the subject is readable."""
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden("a token bound to one user or session cannot erase", rule="read_scope")
    if (user_id is None) == (namespace_list is None):
        raise InvalidRequest(
            "name exactly one subject: user_id or namespace_list", field="user_id", rule="one_subject"
        )
    if namespace_list is not None:
        if not purge:
            raise InvalidRequest(
                "an erasure by namespace_list removes everything; set purge: true",
                field="purge",
                rule="namespace_list_needs_purge",
            )
        if namespaces:
            raise InvalidRequest(
                "namespaces applies to a user erasure; list them in namespace_list",
                field="namespaces",
                rule="user_only",
            )
        kind, user, nss = NAMESPACES, "", _principal_namespaces(who, namespace_list)
    else:
        assert user_id is not None
        if not user_id:
            raise InvalidRequest("user_id must not be empty", field="user_id", rule="non_empty")
        kind, user, nss = USER, user_id, _principal_namespaces(who, namespaces)
    now = utcnow()
    req = store.Request(
        erasure_id=uuid.uuid4().hex,
        token_id=who.token_id,
        kind=kind,
        user_id=user,
        namespaces=nss,
        purge=purge,
        state=REMOVING,
        created_at=now,
    )
    if kind == NAMESPACES:
        tables = await _hide_namespaces(svc, nss)
    else:
        tables = {}
        for ns in nss:
            _merge(tables, ns, await _hide_user(svc, req.erasure_id, ns, user, purge))
    req.receipt = _receipt(req, tables, now)
    req.steps_total = len(nss) * len(_steps(req))
    await svc.run(store.save_request, svc.ch, req)
    await _enqueue(svc, req.erasure_id)
    return req


def _steps(req: store.Request) -> list[store.Step]:
    return store.namespace_steps() if req.kind == NAMESPACES else store.user_steps(req.purge)


def _merge(tables: dict[str, store.ReceiptLine], ns: str, counts: dict[str, store.TableCount]) -> None:
    for table, c in counts.items():
        line = tables.setdefault(table, store.ReceiptLine(hidden={}))
        line.tombstoned += c.tombstoned
        line.removed += c.removed
        line.digests[ns] = c.digest
        line.hidden = (line.hidden or {}) | {ns: c.tombstoned}


def _receipt(req: store.Request, tables: dict[str, store.ReceiptLine], asked: datetime) -> store.Receipt:
    receipt = store.Receipt(
        erasure_id=req.erasure_id,
        kind=req.kind,
        user_id=req.user_id,
        namespaces=req.namespaces,
        purge=req.purge,
        asked_at=asked.isoformat(),
        unreadable_at=utcnow().isoformat(),
        removed_at=None,
        tables=tables,
    )
    receipt.digest = _overall_digest(receipt)
    return receipt


def _overall_digest(receipt: store.Receipt) -> str:
    """One SHA-256 over the subject and every table's key digests (not the counts of
    removal, which grow as the worker goes)."""
    keyed = {
        "kind": receipt.kind,
        "user_id": receipt.user_id,
        "namespaces": receipt.namespaces,
        "digests": {t: line.digests for t, line in sorted(receipt.tables.items())},
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def _enqueue(svc: Services, erasure_id: str) -> None:
    # One job per request (its id): enqueuing it again while it is queued or running is a no-op.
    await svc.arq.enqueue_job(
        REMOVE_JOB,
        jobs.build(jobs.ErasureRemoveJob, erasure_id=erasure_id),
        _job_id=f"erasure-{erasure_id}",
        _queue_name=QUEUE,
    )
    await wake_workers(svc.redis)


# -- a user: nothing readable -----------------------------------------------------------


# How far ahead of its start an erasure's fence first reaches (it is lowered to the
# answer's version once the rows are tombstoned; the thread leases wait at most 30 s).
FENCE_HORIZON_NS = 120 * 1_000_000_000


async def _hide_user(svc: Services, eid: str, ns: str, user: str, purge: bool) -> dict[str, store.TableCount]:
    """The user's rows of one namespace tombstoned, under the user's erasure fence: an
    append of the user stamped before the answer that lands after the reads erases its
    own turns (loom.store.fences)."""
    await fences.set_user_fence(svc.redis, ns, user, next_version() + FENCE_HORIZON_NS)
    try:
        return await _tombstone_user(svc, eid, ns, user, purge)
    finally:
        await fences.set_user_fence(svc.redis, ns, user, next_version())


async def _tombstone_user(
    svc: Services, eid: str, ns: str, user: str, purge: bool
) -> dict[str, store.TableCount]:
    """Few statements, few one after another (on a small machine statements running at
    once compete for the cores): the briefs and the memory tables, named by the user
    alone, from the start; the user's threads read while search's change window is
    raised (and the keys fixed for the removal, beside everything); then, under the
    threads' leases, the turns, the thread rows and the embedding rows at the same time;
    then one read of what was written while the window is raised again (the answer
    carries the counts and the keys' digests)."""
    try:
        briefs, memory, conversations = await asyncio.gather(
            svc.run(store.tombstone_briefs, svc.ch, eid, ns, user),
            memory_erasing.hide_user(svc, ns, user),
            _tombstone_conversations(svc, eid, ns, user, purge),
        )
    except LeaseTimeout:
        raise Unavailable(
            "the user's conversations are busy with other writes; retry the erasure", rule="retry"
        ) from None
    counts = conversations
    n_briefs, revisions, brief_digest = briefs
    counts["session_briefs"] = store.TableCount(tombstoned=n_briefs, digest=brief_digest)
    counts["session_brief_revisions"] = store.TableCount(removed=revisions, digest=brief_digest)
    counts.update(memory)
    return counts


async def _tombstone_conversations(
    svc: Services, eid: str, ns: str, user: str, purge: bool
) -> dict[str, store.TableCount]:
    """On the way to the answer, one read after another: the user's threads (one read),
    then, under their leases, the turns' and embedding rows' tombstones side by side,
    then their count. The keys the removal needs (and the receipt's digests) are fixed
    beside all that, off the way: the tombstones name the user's live rows by thread and
    newest owner, which is what the keys name less what was already tombstoned. Only
    the thread rows' fate, and a hand-over (a thread holding another user's rows), wait
    for the keys."""
    window = [(ns, search_marks.WHOLE)]
    # Search's change window for the whole namespace, raised before any row is rewritten
    # (the reads only read, so they go at the same time) and again after (also when a
    # write fails: part of it may have landed).
    fixing = asyncio.ensure_future(svc.run(store.fix_user_keys, svc.ch, eid, ns, user, purge=purge))
    try:
        found, _ = await asyncio.gather(
            svc.run(store.user_threads, svc.ch, ns, user),
            search_marks.raise_marks(svc.redis, svc.ch, svc.run, window),
        )
    except BaseException:
        await asyncio.gather(fixing, return_exceptions=True)
        raise
    counts: dict[str, store.TableCount] = {
        t: store.TableCount() for t in ("conversations", "conversation_embeddings", "handed_over", "threads")
    }
    stamped: dict[str, list[int]] = {t: [] for t in store.WRITTEN_TABLES}
    settled = False

    async def embeddings() -> None:
        if found.mixed:  # the hand-over reads the fixed keys
            await fixing
            counts["handed_over"].tombstoned += await svc.run(_hand_over, svc, eid, ns, user, found.mixed)
        stamped["conversation_embeddings"].append(
            await svc.run(store.tombstone_embeddings, svc.ch, ns, user, found.threads)
        )

    def turns() -> None:
        stamped["conversations"].append(store.tombstone_turns(svc.ch, ns, user, found.threads))

    async def threads() -> None:
        # The thread rows' fate does not wait for the turns' tombstones (a turn of the
        # user counts as gone); they are settled once (the keys are fixed).
        nonlocal settled
        keys = await fixing
        if settled:
            return
        settled = True
        gone, kept = await svc.run(store.thread_fates, svc.ch, ns, user, keys, found.mixed)
        version = next_version()
        await asyncio.gather(
            svc.run(store.record_thread_keys, svc.ch, eid, ns, gone, kept, version),
            svc.run(store.settle_threads, svc.ch, ns, gone, kept, version),
        )
        stamped["threads"].append(version)

    async def work(_: set[tuple[str, str]]) -> None:
        # Run once per set of thread leases won (usually once); each pass re-reads, so one
        # that runs again finds nothing left, and rows written meanwhile are caught.
        await asyncio.gather(svc.run(turns), embeddings(), threads())

    try:
        if found.threads:
            await under_thread_leases(svc.redis, [(ns, t) for t in found.threads], work, wait_s=30.0)
        else:
            await work(set())
        keys = await fixing
    except BaseException:
        await search_marks.raise_marks(svc.redis, svc.ch, svc.run, window)
        await asyncio.gather(fixing, return_exceptions=True)
        raise
    # Counted once written (the statements that wrote them did not count first), while
    # the window is raised again; the rows stamped are keyed for the removal too.
    written, _, _ = await asyncio.gather(
        svc.run(store.written, svc.ch, ns, sorted({*found.threads, *keys.threads}), stamped),
        search_marks.raise_marks(svc.redis, svc.ch, svc.run, window),
        svc.run(store.key_stamped, svc.ch, eid, ns, found.threads, stamped),
    )
    for table, n in written.items():
        counts[table].tombstoned += n
    counts["conversations"].digest = keys.digests.turn
    counts["conversation_embeddings"].digest = keys.digests.embedding
    counts["threads"].digest = keys.digests.thread
    return counts


def _hand_over(svc: Services, eid: str, ns: str, user: str, mixed: set[str]) -> int:
    """Embedding rows of the user's turns that another user's live copy shares pass to
    that copy (same rules as a delete's hand-over)."""
    copies = store.other_copies(svc.ch, eid, ns, user, EMBED_CHARS, sorted(mixed))
    if not copies:
        return 0
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for thread_id, c in copies:
        by_key.setdefault((thread_id, c.msg_id), {})[c.agent] = c
    rows = store.live_embedding_rows(svc.ch, eid, ns, user, sorted(by_key))
    writes = []
    for row in rows:
        turn = by_key.get((row.thread_id, row.msg_id), {})
        others = [c for a, c in turn.items() if a != row.agent and c.user_id != user]
        target = heir(row, turn.get(row.agent), others)
        if target is not None:
            writes.append(handed_to(row, target))
    store.hand_over(svc.ch, eid, ns, writes)
    return len(writes)


# -- namespaces: nothing readable, no Redis key left --------------------------------------


async def _hide_namespaces(svc: Services, nss: Sequence[str]) -> dict[str, store.ReceiptLine]:
    tables: dict[str, store.ReceiptLine] = {}
    for ns in nss:
        counts = await svc.run(store.namespace_counts, svc.ch, ns)
        await svc.run(store.hide_namespace, svc.ch, ns)
        counts["redis_keys"] = store.TableCount(removed=await purge_redis(svc.redis, ns))
        _merge(tables, ns, counts)
    return tables


def _owned(key: str, prefix: str) -> bool:
    """Whether a key that `prefix*` matched is this namespace's, not one of a namespace
    whose name extends it past a ':' ("a" and "a:b"): what follows the prefix is a
    turn's hash (claims) or a job id (memory job statuses) or a bucket or the ready mark (landed notes), never a ':' more."""
    rest = key[len(prefix) :]
    if prefix.startswith((redis_keys.TURN_CLAIM, redis_keys.MEMORY_JOB)):
        return ":" not in rest
    return rest in ("ready", "ready:rebuilding") or (len(rest) == 3 and ":" not in rest)


async def purge_redis(redis: Redis, namespace: str) -> int:
    """Delete every Redis key of the namespace (its turn claims, landed notes, search
    marks, recording and namespace caches, deletion fences, memory job statuses and the memory search
    cache's token); returns how many. Thread leases are left to expire (seconds):
    removing one a writer holds would break its exclusion."""
    removed = int(
        await redis.delete(
            search_marks.key(namespace),
            recording_cache.key(namespace),
            redis_keys.namespace_config(namespace),
            fences.key(namespace),
            redis_keys.memory_version_of(namespace),  # retires cached reads of its facts
        )
    )
    for prefix in (
        redis_keys.turn_claims_of(namespace),
        redis_keys.landed_of(namespace),
        redis_keys.memory_jobs_of(namespace),
    ):
        batch: list[bytes] = []
        async for raw in redis.scan_iter(match=prefix + "*", count=1000):
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            if _owned(text, prefix):
                batch.append(raw)
            if len(batch) >= 500:
                removed += int(await redis.delete(*batch))
                batch = []
        if batch:
            removed += int(await redis.delete(*batch))
    return removed


# -- the removal (worker) -------------------------------------------------------------------


async def run_removal(svc: Services, erasure_id: str, *, crash_after: int | None = None) -> store.Request:
    """The job: every step not yet recorded done, all at the same time (they are
    independent: each names rows by the keys fixed at the request), each recorded after
    it ran, so a killed job resumes where it stopped and counts each row once.
    `crash_after` stops it once that many steps are recorded (tests of a kill)."""
    req = await svc.run(store.get_request, svc.ch, erasure_id)
    if req is None:
        raise NotFound(f"no erasure {erasure_id!r}", field="erasure_id")
    if req.state == DONE:
        return req
    progress = req.receipt.steps()
    steps = [(ns, step) for ns in req.namespaces for step in _steps(req)]
    await _plan(svc, req, steps)
    lock = asyncio.Lock()

    async def one(ns: str, step: store.Step) -> None:
        entry = progress[f"{ns}/{step.name}"]
        if entry.done:
            return
        await svc.run(store.remove, svc.ch, step, store.step_params(erasure_id, ns, req.user_id))
        async with lock:
            if crash_after is not None and req.steps_done >= crash_after:
                raise _Crash(f"stopped after {req.steps_done} step(s)")
            entry.done = True
            line = req.receipt.tables.setdefault(step.table, store.ReceiptLine())
            line.removed += entry.rows
            req.steps_done = sum(1 for e in progress.values() if e.done)
            await svc.run(store.save_request, svc.ch, req)

    results = await asyncio.gather(*(one(ns, step) for ns, step in steps), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    if req.kind == USER:
        await svc.run(store.drop_keys, svc.ch, erasure_id)
    req.state = DONE
    req.receipt.removed_at = utcnow().isoformat()
    await svc.run(store.save_request, svc.ch, req)
    await _announce(svc, req)
    return req


async def _announce(svc: Services, req: store.Request) -> None:
    """The erasure.completed webhook event, in each namespace erased: the erasure's id,
    kind and rows removed per table (over all its namespaces). No user id: the erasure
    id is the receipt's name."""
    removed = {t: line.removed for t, line in req.receipt.tables.items()}
    for ns in req.namespaces:
        await webhook_events.emit(
            svc,
            ns,
            webhook_registry.ERASURE_COMPLETED,
            {
                "erasure_id": req.erasure_id,
                "kind": req.kind,
                "removed": removed,
                "removed_at": req.receipt.removed_at,
            },
        )


async def _plan(svc: Services, req: store.Request, steps: list[tuple[str, store.Step]]) -> None:
    """Count each step's rows once, before any removal, and record the counts (one
    write): a retry after a crash between a removal and its record keeps the first
    count. Rows a lightweight DELETE hid at the request were counted then."""
    progress = req.receipt.steps()
    todo = [(ns, step) for ns, step in steps if f"{ns}/{step.name}" not in progress]
    if not todo:
        return

    async def count(ns: str, step: store.Step) -> int:
        if step.apply_mask:
            line = req.receipt.tables.get(step.table)
            return (line.hidden or {}).get(ns, 0) if line is not None else 0
        params = store.step_params(req.erasure_id, ns, req.user_id)
        return await svc.run(store.count_rows, svc.ch, step, params)

    counted = await asyncio.gather(*(count(ns, step) for ns, step in todo))
    for (ns, step), rows in zip(todo, counted, strict=True):
        progress[f"{ns}/{step.name}"] = store.StepProgress(rows=rows)
    await svc.run(store.save_request, svc.ch, req)


class _Crash(RuntimeError):
    """A removal stopped on purpose halfway (tests)."""


async def status(svc: Services, who: Principal, erasure_id: str) -> store.Request:
    """erasure.status (admin): the request's progress and receipt."""
    who.require_role(Role.admin)
    req = await svc.run(store.get_request, svc.ch, erasure_id)
    if req is None or not set(req.namespaces) <= set(who.namespaces):
        raise NotFound(f"no erasure {erasure_id!r} this token may see", field="erasure_id")
    return req


__all__ = ["DONE", "FAILED", "REMOVE_JOB", "REMOVING", "purge_redis", "request", "run_removal", "status"]
