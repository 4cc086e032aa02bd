"""memory.set_from_messages (writer): messages become evidence, then facts.

1. Every message is stored as evidence first (loom.memory_evidence), whether or not the
   namespace records conversations: the conversation plane is neither read nor written.
   A message that reads as high keeps its place but no text, and is never sent on.
2. The LLM extracts candidate facts from the readable messages (prompts/extract.txt).
   A candidate that reads as high is dropped (never stored, never embedded).
3. For each candidate the scope's most similar live facts are found (memory.search's
   hybrid ranking); the LLM then decides, against those, to ADD, UPDATE, DELETE or leave
   (NONE) each (prompts/decide.txt), as Mem0 does. With no similar fact at all the
   candidates are added without a second call.
4. Each decision is applied and recorded in loom.memory_decisions with the evidence ids
   it came from; an added or updated fact carries them too (its source).

With the stock fake LLM step 1 happens and the answer says `reason: "llm_not_configured"`.
`defer: true` stores the evidence, then runs steps 2-4 on the arq pool and answers the
job's id. Extractions of one user take a Redis lease so two never decide on the same
facts at once. A write that an erasure of its user outlived undoes itself and answers
`reason: "subject_erased"` (loom.ops.memory.erasing).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from loom import failures, jobs, redis_keys
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import InvalidRequest
from loom.leases import hold
from loom.models.memory import SetFromMessagesRequest
from loom.ops.memory import erasing, job_status, validity
from loom.ops.memory import facts as fact_ops
from loom.ops.memory import profile as profile_ops
from loom.ops.memory.common import (
    MAX_FACT_CHARS,
    MAX_MESSAGES,
    SIMILAR_PER_FACT,
    derive_msg_id,
    evidence_id,
    new_memory_id,
    scope_of,
)
from loom.providers.llm import ChatMessage, LLMError, LLMNotConfigured, json_object
from loom.queue import QUEUE, wake_workers
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import evidence as ev_store
from loom.store import memories as store
from loom.store.evidence import Evidence
from loom.store.memories import Fact, Scope

log = loom_logging.get("loom.memory.extraction")
_PROMPTS = Path(__file__).parent / "prompts"
JOB = jobs.MEMORY_EXTRACT
ROLES = ("user", "assistant", "system", "tool")
MAX_PROMPT_CHARS = 24_000


@dataclass
class Message:
    role: str
    content: str
    msg_id: str | None = None
    ts: datetime | None = None


@dataclass
class Decision:
    action: str  # add | update | delete | leave
    memory_id: str  # for an update, the new fact (it supersedes the old one)
    text: str = ""
    supersedes: str | None = None  # update: the fact it replaced


@dataclass
class Extraction:
    evidence_ids: list[str]
    extracted: int = 0  # candidate facts the model proposed (after the high screen)
    decisions: list[Decision] = field(default_factory=list)
    reason: str | None = None  # llm_not_configured | llm_failed | nothing_readable | deferred
    job_id: str | None = None
    extraction_id: str | None = None


def _lease_key(scope: Scope) -> str:
    return redis_keys.memory_lease(scope.namespace, scope.user_id)


async def set_from_messages(svc: Services, who: Principal, req: SetFromMessagesRequest) -> Extraction:
    who.require_role(Role.writer)
    scope = scope_of(who, req)
    messages = [Message(m.role, m.content, m.msg_id, m.ts) for m in req.messages]
    if not messages:
        raise InvalidRequest("messages must hold at least one message", field="messages", rule="min_length")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequest(f"at most {MAX_MESSAGES} messages per call", field="messages", rule="max_length")
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(
                f"role must be one of {', '.join(ROLES)}", field=f"messages[{i}].role", rule="one_of"
            )
    writes = erasing.Writes(scope.namespace, scope.user_id)
    rows = build_evidence(scope, messages, "messages")
    await svc.run(ev_store.insert, svc.ch, rows)
    writes.add_evidence(rows)
    if await erasing.settle(svc, writes):
        return Extraction([], reason=erasing.ERASED)
    ids = [r.evidence_id for r in rows]
    if req.defer:
        # Its status first (memory.job_status), so the worker's `running` follows it.
        job_id = "mx" + uuid.uuid4().hex
        await job_status.queued(svc, scope, job_id)
        job = await svc.arq.enqueue_job(JOB, _payload(scope, ids), _job_id=job_id, _queue_name=QUEUE)
        await wake_workers(svc.redis)
        return Extraction(ids, reason="deferred", job_id=job.job_id if job else None)
    out = await extract(svc, scope, ids)
    await announce(svc, scope, out, None)
    return out


async def announce(svc: Services, scope: Scope, out: Extraction, job_id: str | None) -> None:
    """The memory.extracted webhook event (loom.ops.webhooks), for an extraction that ran."""
    await job_status.announce(
        svc,
        scope,
        extraction_id=out.extraction_id,
        counts=_counts(out),
        reason=out.reason,
        evidence=len(out.evidence_ids),
        job_id=job_id,
    )


def _counts(out: Extraction) -> job_status.Counts:
    return job_status.counts_of(out.extracted, [d.action for d in out.decisions])


def build_evidence(scope: Scope, messages: list[Message], source: str) -> list[Evidence]:
    now = utcnow()
    rows: list[Evidence] = []
    for i, m in enumerate(messages):
        # Messages with no time keep their order in time (a microsecond apart).
        mid = m.msg_id or derive_msg_id(m.role, m.content)
        high = reads_as_high(m.content)
        rows.append(
            Evidence(
                namespace=scope.namespace,
                user_id=scope.user_id,
                evidence_id=evidence_id(scope, source, mid),
                session_id=scope.session_id,
                run_id=scope.run_id,
                source=source,
                msg_id=mid,
                role=m.role,
                content="" if high else m.content,
                high_sensitivity=high,
                ts=m.ts or now + timedelta(microseconds=i),
                created_at=now,
                version=next_version(),
            )
        )
    return rows


def _payload(scope: Scope, ids: list[str]) -> dict[str, Any]:
    return jobs.build(
        jobs.MemoryExtractJob,
        namespace=scope.namespace,
        user_id=scope.user_id,
        session_id=scope.session_id,
        run_id=scope.run_id,
        evidence_ids=ids,
    )


async def run_job(svc: Services, payload: dict[str, Any], job_id: str) -> dict[str, Any]:
    """The deferred half, on the arq pool; its status is kept for memory.job_status."""
    job = jobs.read(jobs.MemoryExtractJob, payload)
    scope = Scope(job.namespace, job.user_id, job.session_id, job.run_id)
    await job_status.running(svc, scope, job_id)
    try:
        result = await extract(svc, scope, job.evidence_ids)
    except Exception as exc:
        # Recorded and logged here (its detail cleaned), not raised: arq would log the
        # exception's own text.
        log.warning("deferred memory extraction failed", error=failures.detail(exc))
        reason = await job_status.crashed(svc, scope, job_id, exc)
        return {"extraction_id": None, "extracted": 0, "reason": reason, "decisions": []}
    await job_status.finished(
        svc, scope, job_id, extraction_id=result.extraction_id, counts=_counts(result), reason=result.reason
    )
    await announce(svc, scope, result, job_id)
    return {
        "extraction_id": result.extraction_id,
        "extracted": result.extracted,
        "reason": result.reason,
        "decisions": [
            {"action": d.action, "memory_id": d.memory_id, "supersedes": d.supersedes}
            for d in result.decisions
        ],
    }


async def extract(
    svc: Services, scope: Scope, ids: list[str], *, fact_source: str = fact_ops.EXTRACTION
) -> Extraction:
    """Steps 2-4 over stored evidence (the texts are read back: high ones hold none)."""
    out = Extraction(ids)
    if not svc.llm.configured:
        out.reason = "llm_not_configured"
        return out
    # Stamped before the evidence is read: an erasure that ends after this undoes what
    # the extraction writes.
    writes = erasing.Writes(scope.namespace, scope.user_id)
    order = {eid: i for i, eid in enumerate(ids)}
    stored = await svc.run(ev_store.get, svc.ch, scope.namespace, scope.user_id, ids)
    readable = sorted(
        (e for e in stored if not e.high_sensitivity and e.content and not reads_as_high(e.content)),
        key=lambda e: order.get(e.evidence_id, len(order)),
    )
    if not readable:
        out.reason = "nothing_readable"
        return out
    try:
        candidates = await _extract_facts(svc, readable)
    except LLMNotConfigured:
        out.reason = "llm_not_configured"
        return out
    except (LLMError, ValueError) as exc:
        log.warning("memory extraction failed", error=failures.detail(exc))
        out.reason = "llm_failed"
        return out
    out.extracted = len(candidates)
    out.extraction_id = "x" + uuid.uuid4().hex
    if not candidates:
        return out
    used = [e.evidence_id for e in readable]
    # The facts became true when they were said: the newest message's time.
    said_at = store.aware(max(e.ts for e in readable))
    async with hold(svc.redis, _lease_key(scope), ttl_ms=60_000, wait_s=60.0):
        try:
            out.decisions = await _decide_and_apply(
                svc, scope, candidates, used, out.extraction_id, fact_source, writes, said_at
            )
        except (LLMError, ValueError) as exc:
            log.warning("memory decision failed", error=failures.detail(exc))
            out.reason = "llm_failed"
        if any(d.action != "leave" for d in out.decisions):
            await profile_ops.rebuild(svc, scope, writes)
    if await erasing.settle(svc, writes):
        out.decisions, out.reason = [], erasing.ERASED
    return out


def _prompt(name: str) -> str:
    return (_PROMPTS / f"{name}.txt").read_text()


async def _extract_facts(svc: Services, readable: list[Evidence]) -> list[str]:
    lines, size = [], 0
    for e in readable:
        line = f"{e.role}: {e.content}"
        if size + len(line) > MAX_PROMPT_CHARS:
            break
        lines.append(line)
        size += len(line)
    reply = await svc.llm.complete(
        [ChatMessage("system", _prompt("extract")), ChatMessage("user", "\n".join(lines))], temperature=0.0
    )
    raw = json_object(reply).get("facts", [])
    if not isinstance(raw, list):
        raise ValueError("facts is not a list")
    seen: set[str] = set()
    out: list[str] = []
    for item in raw:
        text = str(item).strip()[:MAX_FACT_CHARS] if isinstance(item, (str, int, float)) else ""
        if text and text not in seen and not reads_as_high(text):
            seen.add(text)
            out.append(text)
    return out


async def _similar(svc: Services, scope: Scope, candidates: list[str]) -> list[Fact]:
    """The user's live facts most similar to any candidate (the whole user, not only this
    session: a fact stated in another session is the one to update)."""
    user_scope = Scope(scope.namespace, scope.user_id)
    found: dict[str, Fact] = {}
    for text in candidates:
        result = await fact_ops.hybrid(svc, user_scope, text, limit=SIMILAR_PER_FACT)
        for h in result.hits:
            found.setdefault(h.fact.memory_id, h.fact)
    return list(found.values())


async def _decide_and_apply(
    svc: Services,
    scope: Scope,
    candidates: list[str],
    used: list[str],
    extraction_id: str,
    fact_source: str,
    writes: erasing.Writes,
    said_at: datetime,
) -> list[Decision]:
    existing = await _similar(svc, scope, candidates)
    if existing:
        listing = [{"id": str(i), "text": f.text} for i, f in enumerate(existing)]
        reply = await svc.llm.complete(
            [
                ChatMessage("system", _prompt("decide")),
                ChatMessage(
                    "user", json.dumps({"existing": listing, "new_facts": candidates}, ensure_ascii=False)
                ),
            ],
            temperature=0.0,
        )
        raw = json_object(reply).get("decisions", [])
        if not isinstance(raw, list):
            raise ValueError("decisions is not a list")
    else:
        raw = [{"event": "ADD", "text": c} for c in candidates]
    decisions = _parse_decisions(raw, existing)
    await _apply(svc, scope, decisions, used, fact_source, writes, said_at)
    now = utcnow()
    writes.extraction_ids.append(extraction_id)
    await svc.run(
        store.record_decisions,
        svc.ch,
        [
            {
                "namespace": scope.namespace,
                "user_id": scope.user_id,
                "extraction_id": extraction_id,
                "seq": i,
                "action": d.action,
                "memory_id": d.memory_id,
                "text": d.text,
                "evidence_ids": used,
                "created_at": now,
            }
            for i, d in enumerate(decisions)
        ],
    )
    return decisions


_ACTIONS = {"ADD": "add", "UPDATE": "update", "DELETE": "delete", "NONE": "leave"}


def _parse_decisions(raw: list[Any], existing: list[Fact]) -> list[Decision]:
    """The model's decisions that name a known fact (update, delete, leave) or carry a
    text (add, update) that does not read as high; anything else is ignored."""
    out: list[Decision] = []
    touched: set[str] = set()
    for item in raw:
        if not isinstance(item, dict):
            continue
        action = _ACTIONS.get(str(item.get("event", "")).upper())
        text = str(item.get("text") or "").strip()[:MAX_FACT_CHARS]
        if action is None or (text and reads_as_high(text)):
            continue
        if action == "add":
            if text:
                out.append(Decision("add", new_memory_id(), text))
            continue
        idx = str(item.get("id", ""))
        if not idx.isdigit() or int(idx) >= len(existing):
            continue
        mid = existing[int(idx)].memory_id
        if mid in touched or (action == "update" and not text):
            continue
        touched.add(mid)
        out.append(Decision(action, mid, text if action == "update" else ""))
    return out


async def _apply(
    svc: Services,
    scope: Scope,
    decisions: list[Decision],
    used: list[str],
    fact_source: str,
    writes: erasing.Writes,
    said_at: datetime,
) -> None:
    """Add new facts; an update writes a new fact that supersedes the old one (which
    keeps its text, its validity closed); a delete closes the fact's validity at the
    evidence's time (history kept: only memory.delete forgets)."""
    now = utcnow()
    targets = [d.memory_id for d in decisions if d.action in ("update", "delete")]
    # Revisions rewrite whole rows: the old facts are read again with their vectors.
    olds = await svc.run(store.get, svc.ch, scope.namespace, scope.user_id, targets, with_vector=True)
    rows: list[Fact] = []  # new facts (embedded)
    closed: list[Fact] = []  # closing versions of old ones
    for d in decisions:
        valid = validity.times_for(d.text, None, None, said_at)
        if d.action == "add":
            said = validity.Statement(text=d.text, source=fact_source, evidence_ids=used)
            rows.append(validity.new_fact(scope, d.memory_id, said, now, valid))
            continue
        old = olds.get(d.memory_id)
        if old is None or old.tombstoned:
            continue  # forgotten meanwhile
        if d.action == "update":
            said = validity.Statement(
                text=d.text, kind=old.kind, key=old.key, source=fact_source, evidence_ids=used
            )
            mid = validity.successor_id(old.namespace, old.user_id, old.memory_id)
            new = validity.new_fact(old, mid, said, now, valid)
            closed.append(validity.link(old, new, now))
            rows.append(new)
            d.supersedes, d.memory_id = old.memory_id, new.memory_id
        elif d.action == "delete":
            closed.append(validity.close(old, said_at, now))
    await fact_ops.embed_into(svc, rows)
    for r in [*rows, *closed]:
        r.version = next_version()
    await svc.run(store.insert, svc.ch, [*rows, *closed])
    writes.add_facts([*rows, *closed])
