"""conversation.compact (writer, needs an LLM provider): replace the oldest turns of one
agent's thread with one summary.

The window. Of the thread's live recorded turns, the last ``keep_recent`` are kept as
they are; the older ones form the window, minus:
- turns that read as high (their ``high_sensitivity`` mark): they stay live and are
  never sent to the summarizer, so the summary can come before them in the thread;
- saved turns: never summarised nor tombstoned; they stay verbatim between the summary
  and the recent turns.

Earlier summaries in the window:
- one a failed run left (its ``compacted_from`` turns are all still live, in the
  window, and it sits at the first one's ``ts``) is replaced unread: its turns are
  summarised again;
- the others at the start of the window are folded into the prompt, in order, from a
  separate allowance (LOOM_COMPACT_SUMMARY_ALLOWANCE_CHARS); one that does not fit
  what is left of it stays live;
- one further into the window takes prompt budget like any turn and is replaced too.

The turns are then taken oldest first while they fit the prompt budget
(LOOM_COMPACT_PROMPT_BUDGET_CHARS, characters of turn text); a single turn longer than
the whole budget is sent cut to it. Fewer than ``min_to_compact`` new (non-summary)
turns: nothing is compacted (``below-min-to-compact``); none at all because the window
holds only saved or high turns: ``nothing-to-compact``. Earlier summaries count toward
neither ``min_to_compact`` nor ``messages_summarized``.

A namespace whose owner switched model calls off (namespace.set_policy) is refused
before anything is read, as is a deployment with no LLM configured (the fake).

The work runs as an arq job on the worker pool (``compact_thread``): the summarizer
call and the summary's embedding finish first; the summary is checked with
reads_as_high (``summary-high-sensitivity``: never embedded, and not worth a retry, as
the same live window most likely gives the same summary) and must embed
(``embed-failed``: worth a retry). Then, under the thread lease (save, unsave, append's
embedding write and delete share it) and inside search's change window, the thread is
read again (one statement: every agent's copy of every turn with its version, and the
embedding rows): if any turn of the window was saved, deleted, compacted or otherwise
rewritten meanwhile (its version is not the one the window read) nothing is written
(``window-changed``, worth a retry), so a turn is never lost or summarised twice; turns
appended meanwhile are newer and untouched. Otherwise the summary is
inserted (one embedded ``system`` turn, ``is_summary``, ``metadata.compacted_from``
listing the replaced msg_ids, at the window's first turn's ``ts``) with its embedding
row, the replaced turns are tombstoned (reason ``compacted``), and the thread's
embedding rows are settled as conversation.delete settles them: a row another agent's
live copy with the same text still serves passes to that copy, the others become
tombstones. The summary and the tombstones are one insert, so a crash never leaves a
turn tombstoned without its summary (see ``_retire`` for the crash cases).
The job pushes its answer before it sends the conversation.compacted webhook event
(finding the namespace's webhooks is a ClickHouse read the client need not wait for).

Compactions share the worker process (its event loop, its I/O threads) and the engine
with the appends' embedding jobs: LOOM_COMPACT_CONCURRENCY (default 1) bounds how many
do store work (the window read, the retirement) at once in a process, so a burst of
them queues rather than crowding the appends out; their summarizer calls are not
bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loom import failures, jobs, redis_calls, redis_keys
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import InvalidRequest, LoomError, NotFound, Unavailable
from loom.leases import LeaseTimeout, thread_lease
from loom.models.conversation.lifecycle import CompactRequest
from loom.ops.conversation.common import EMBED_CHARS, embed_text, model_text
from loom.ops.conversation.lifecycle.compaction_gate import CompactionGate
from loom.ops.conversation.lifecycle.deleting import ThreadState, settle_writes, with_vectors
from loom.ops.embedding.writer import ModelFn
from loom.ops.platform import namespaces as namespace_ops
from loom.ops.webhooks import events as webhook_events
from loom.ops.webhooks import registry as webhook_registry
from loom.providers.llm import LAST_USAGE, ChatMessage, LLMError
from loom.queue import QUEUE, wake_workers
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import compaction as store
from loom.store import conversations as conv_store
from loom.store import deletion, search_marks
from loom.store import embeddings as emb_store

log = loom_logging.get("loom.conversation.compact")

COMPACT_JOB = jobs.COMPACT_THREAD
COMPACTED = "compacted"  # the tombstone_reason of a replaced turn
KEEP_RECENT = 10
MIN_TO_COMPACT = 4
SUMMARY_MAX_TOKENS = 1_024
_JOB_TTL_S = 3_600

# Reasons an answer gives when nothing was compacted.
EMBED_FAILED = "embed-failed"
SUMMARY_HIGH = "summary-high-sensitivity"
NOTHING = "nothing-to-compact"
BELOW_MIN = "below-min-to-compact"
WINDOW_CHANGED = "window-changed"
SUMMARIZER_FAILED = "summarizer-failed"
_RETRY = {
    EMBED_FAILED: True,
    SUMMARY_HIGH: False,
    NOTHING: False,
    BELOW_MIN: False,
    WINDOW_CHANGED: True,
    SUMMARIZER_FAILED: True,
}
_NOTES = {
    SUMMARY_HIGH: "the summary read as high sensitivity and was not stored; not worth a retry: "
    "the same live window most likely gives the same summary",
    EMBED_FAILED: "the summary could not be embedded; nothing was compacted; worth a retry",
    WINDOW_CHANGED: "the window changed while it was summarised (a turn saved, deleted or compacted "
    "meanwhile); nothing was compacted; worth a retry",
    SUMMARIZER_FAILED: "the summarizer failed or timed out; nothing was compacted; worth a retry",
}

PROMPT = (Path(__file__).parent / "prompts" / "compact_system.txt").read_text(encoding="utf-8")


class ProviderMissing(LoomError):
    """The op needs a provider that is not configured."""

    status, code = 409, "provider_not_configured"


class ModelCallsOff(LoomError):
    """The namespace's owner switched model calls off: no turn of it goes to a model."""

    status, code = 409, "model_calls_disabled"


@dataclass(kw_only=True)
class CompactResult:
    thread_id: str
    agent: str
    messages_summarized: int = 0
    summary_msg_id: str | None = None
    reason: str | None = None
    retry: bool | None = None  # when nothing was compacted: whether a retry may do better
    note: str | None = None
    summaries_replaced: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    job_id: str | None = None

    def done(self, reason: str) -> CompactResult:
        self.reason, self.retry, self.note = reason, _RETRY[reason], _NOTES.get(reason)
        return self


# -- the window -----------------------------------------------------------------------


@dataclass
class Plan:
    sent: list[conv_store.Turn] = field(default_factory=list)  # turns and summaries the prompt carries
    folded: list[conv_store.Turn] = field(default_factory=list)  # leading summaries folded in
    unread: list[conv_store.Turn] = field(default_factory=list)  # failed runs' summaries, replaced unread
    excluded: int = 0  # high or saved turns in the window

    @property
    def new_turns(self) -> int:
        return sum(1 for t in self.sent if not t.is_summary)

    @property
    def replaced(self) -> list[conv_store.Turn]:
        return [*self.folded, *self.sent, *self.unread]

    @property
    def first(self) -> conv_store.Turn:
        return min(self.replaced, key=lambda t: (t.ts, t.msg_id))


def _failed_run(summary: conv_store.Turn, window: dict[str, conv_store.Turn]) -> bool:
    """A summary a failed run left: its turns all still live and in the window, and it at
    the first one's ts."""
    ids = summary.metadata.get("compacted_from")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i in window for i in ids):
        return False
    return summary.ts == min(window[i].ts for i in ids)


def plan(turns: list[conv_store.Turn], keep_recent: int, budget: int, allowance: int) -> Plan:
    """Which turns a run summarises (``turns``: the thread's live turns, oldest first)."""
    older = turns[: max(0, len(turns) - keep_recent)]
    out = Plan()
    window = [t for t in older if not (t.high_sensitivity or t.is_saved)]
    out.excluded = len(older) - len(window)
    by_id = {t.msg_id: t for t in window}
    rest = []
    for t in window:
        if t.is_summary and _failed_run(t, by_id):
            out.unread.append(t)
        else:
            rest.append(t)
    i = 0
    left = allowance
    while i < len(rest) and rest[i].is_summary:  # the summaries at the start
        if len(rest[i].content) <= left:
            out.folded.append(rest[i])
            left -= len(rest[i].content)
        i += 1
    used = 0
    for t in rest[i:]:
        size = len(t.content)
        if used + size > budget:
            if not out.sent:  # one turn longer than the whole budget: sent cut to it
                out.sent.append(t)
            break
        out.sent.append(t)
        used += size
    return out


def prompt_messages(p: Plan, budget: int) -> list[ChatMessage]:
    parts = []
    if p.folded:
        parts.append("Earlier summaries:\n" + "\n\n".join(t.content for t in p.folded))
    lines = [f"[{t.role}{' summary' if t.is_summary else ''}] {t.content[:budget]}" for t in p.sent]
    parts.append("Turns to summarise:\n" + "\n\n".join(lines))
    return [ChatMessage("system", PROMPT), ChatMessage("user", "\n\n".join(parts))]


# -- the job (worker side) -----------------------------------------------------------


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


async def _summarise(svc: Services, msgs: list[ChatMessage]) -> tuple[str, int, int]:
    LAST_USAGE.set(None)
    async with asyncio.timeout(svc.settings.llm_timeout_seconds + 5.0):
        text = await svc.llm.complete(msgs, max_tokens=SUMMARY_MAX_TOKENS, temperature=0.0)
    usage = LAST_USAGE.get()
    if usage is None:  # the provider reported no counts: estimated from the text
        usage = (sum(_estimate_tokens(m.content) for m in msgs), _estimate_tokens(text))
    return text.strip(), usage[0], usage[1]


def _common(values: list[str]) -> str:
    return values[0] if values and all(v == values[0] for v in values) else ""


def _summary_turn(p: Plan, ns: str, agent: str, thread_id: str, text: str, tokens: int) -> conv_store.Turn:
    first = p.first
    ids = [t.msg_id for t in sorted(p.replaced, key=lambda t: (t.ts, t.msg_id))]
    digest = hashlib.sha256("\0".join(ids).encode()).hexdigest()[:16]
    sources = [t for t in p.replaced if not t.is_summary] or p.replaced
    return conv_store.Turn(
        namespace=ns,
        agent=agent,
        thread_id=thread_id,
        msg_id=f"s_{digest}_{uuid.uuid4().hex[:8]}",
        ts=first.ts,
        role="system",
        content=text,
        user_id=_common([t.user_id for t in sources]),
        run_id=_common([t.run_id for t in sources]),
        metadata={"compacted_from": ids},
        tokens=tokens,
        is_summary=True,
        version=next_version(),
    )


def _current(
    p: Plan, agent: str, copies: dict[str, dict[str, deletion.Copy]]
) -> list[conv_store.Turn] | None:
    """The replaced turns, or None when one of them was saved, deleted, compacted or
    rewritten since the window was read: its row under the lease must be the very
    version the window read (any writer of a turn writes a newer one), still live,
    recorded, unsaved and not high, with the same head (a check that needs no version)."""
    for t in p.replaced:
        cur = copies.get(t.msg_id, {}).get(agent)
        if (
            cur is None
            or cur.version != t.version
            or cur.tombstoned
            or cur.is_saved
            or cur.high_sensitivity
            or cur.origin != conv_store.RECORDED
            or cur.head != t.content[:EMBED_CHARS]
        ):
            return None
    return p.replaced


def _tombstoned(turns: list[conv_store.Turn]) -> list[conv_store.Turn]:
    """A tombstoned version of each turn, from its newest version (the one the window read
    and the retirement found unchanged under the lease; saved_at stays, so the revision
    reaches the saved-message indexes too)."""
    at, version = utcnow(), next_version()
    return [
        replace(t, tombstoned=True, tombstoned_at=at, tombstone_reason=COMPACTED, version=version)
        for t in turns
    ]


async def _raise_marks(svc: Services, ns: str, thread_id: str) -> None:
    await search_marks.raise_marks(svc.redis, svc.ch, svc.run, [(ns, thread_id)])


async def _retire(svc: Services, p: Plan, summary: conv_store.Turn, row: emb_store.EmbeddingRow) -> bool:
    """Under the thread lease and inside search's change window: one read of the thread
    (every agent's copy of every turn, with its version, and the live embedding rows), the
    window checked against it, then two writes at once, the transcript's and the
    embeddings'.

    Each statement costs the embedded engine milliseconds, and the retirement is on the
    critical path of every compaction: so the read is one statement, run while the marks
    are raised (a raise under the lease, as every writer's: the mark it sets is then past
    every row the retirement reads, within the clock margin), and the writes are two
    inserts run at once. The transcript's, of the summary with the
    tombstoned versions of the turns it replaces, is one part (the table is not
    partitioned): a turn is never tombstoned without its summary. The embeddings'
    carries the summary's row with the thread's settled rows (handed over or tombstoned,
    as conversation.delete settles them, counting the replaced turns as tombstoned). The
    marks are raised again once the writes are done (landed or not). If only one of the
    inserts lands (a crash, an engine error: the job then fails and the answer says to
    retry):
    - the transcript's alone: the summary has no embedding row, and the replaced turns'
      rows stay; search verifies those (their versions are under the raised marks) and
      drops them, and the next compaction folds the summary in and replaces it;
    - the embeddings' alone: the window's turns are still live, their rows settled
      away, so search misses them until the next compaction summarises them again; the
      summary's row has no turn and search drops it.
    Neither loses a turn's text."""
    ns, agent, th = summary.namespace, summary.agent, summary.thread_id
    async with thread_lease(svc.redis, ns, th, wait_s=30.0):
        now, _ = await asyncio.gather(
            svc.run(store.thread_now, svc.ch, ns, th, EMBED_CHARS), _raise_marks(svc, ns, th)
        )
        current = _current(p, agent, now.copies)
        if current is None:
            return False
        state = ThreadState(now.copies, now.rows)
        state.retired(agent, [t.msg_id for t in current])
        writes, settled = settle_writes(state)
        try:
            # Most rows settle to tombstones, which carry no vector: only the rows handed
            # over need theirs, read here (decoding 200 vectors costs the process).
            if settled.handed_over:
                writes = await svc.run(with_vectors, svc, writes)
            await asyncio.gather(
                svc.run(conv_store.insert, svc.ch, [summary, *_tombstoned(current)]),
                svc.run(emb_store.insert, svc.ch, [row, *writes]),
            )
        finally:
            await _raise_marks(svc, ns, th)
        return True


async def run(
    svc: Services,
    model: ModelFn,
    ns: str,
    agent: str,
    thread_id: str,
    keep_recent: int,
    min_to_compact: int,
    gate: CompactionGate | None = None,
) -> CompactResult:
    """One compaction (the worker's job body). ``gate`` bounds the compactions whose store
    work (the window read, the retirement) runs at once in the process
    (LOOM_COMPACT_CONCURRENCY); the summarizer and embedding calls run outside it."""
    out = CompactResult(thread_id=thread_id, agent=agent)
    cfg = svc.settings
    gate = gate or CompactionGate(1, 0.0)
    async with gate:
        turns = await svc.run(store.live_turns, svc.ch, ns, agent, thread_id)
    p = plan(turns, keep_recent, cfg.compact_prompt_budget_chars, cfg.compact_summary_allowance_chars)
    if p.new_turns == 0:
        return out.done(NOTHING)
    if p.new_turns < min_to_compact:
        return out.done(BELOW_MIN)
    try:
        text, out.tokens_in, out.tokens_out = await _summarise(
            svc, prompt_messages(p, cfg.compact_prompt_budget_chars)
        )
    except (LLMError, TimeoutError) as exc:
        log.warning("compaction summarizer failed", error=failures.detail(exc))
        return out.done(SUMMARIZER_FAILED)
    if not text:
        return out.done(SUMMARIZER_FAILED)
    if reads_as_high(text):
        return out.done(SUMMARY_HIGH)
    summary = _summary_turn(p, ns, agent, thread_id, text, out.tokens_out)
    try:
        got = await model([model_text(embed_text(text), "system", True, cfg.embed_speaker_prefix)])
    except Exception as exc:
        log.warning("compaction summary embed failed", error=failures.detail(exc))
        return out.done(EMBED_FAILED)
    vector = got.vectors[0] if got.vectors else None
    if vector is None:
        return out.done(EMBED_FAILED)
    row = emb_store.EmbeddingRow(
        namespace=ns,
        thread_id=thread_id,
        msg_id=summary.msg_id,
        agent=agent,
        role="system",
        run_id=summary.run_id,
        user_id=summary.user_id,
        ts=summary.ts,
        text=embed_text(text),
        embedding=vector,
        model=got.model_id,
        is_summary=True,
        version=next_version(),
    )
    try:
        async with gate:  # taken before the lease: no lease is held while waiting here
            retired = await _retire(svc, p, summary, row)
    except LeaseTimeout:
        return out.done(WINDOW_CHANGED)
    if not retired:
        return out.done(WINDOW_CHANGED)
    out.messages_summarized = p.new_turns
    out.summaries_replaced = len(p.replaced) - p.new_turns
    out.summary_msg_id = summary.msg_id
    return out


async def announce(svc: Services, ns: str, out: CompactResult) -> None:
    """The conversation.compacted webhook event of a compaction that wrote a summary. The
    job sends it after pushing the answer: finding the namespace's webhooks is a
    ClickHouse read the awaiting client need not wait for."""
    if out.summary_msg_id is None:
        return
    await webhook_events.emit(
        svc,
        ns,
        webhook_registry.CONVERSATION_COMPACTED,
        {
            "agent": out.agent,
            "thread_id": out.thread_id,
            "messages_summarized": out.messages_summarized,
            "summaries_replaced": out.summaries_replaced,
            "summary_msg_id": out.summary_msg_id,
        },
    )


# -- the op (API side) ---------------------------------------------------------------


def _check(keep_recent: int, min_to_compact: int) -> None:
    if keep_recent < 0:
        raise InvalidRequest("keep_recent must be >= 0", field="keep_recent", rule="ge_0")
    if min_to_compact < 1:
        raise InvalidRequest("min_to_compact must be >= 1", field="min_to_compact", rule="ge_1")


async def compact(svc: Services, who: Principal, ask: CompactRequest) -> CompactResult:
    """conversation.compact (writer). Awaits the worker pool's job, or with ``defer``
    answers its ``job_id`` at once (poll it with :func:`compact_status`)."""
    who.require_role(Role.writer)
    ns = who.namespace(ask.namespace)
    agent, thread_id = ask.agent, ask.thread_id
    _check(ask.keep_recent, ask.min_to_compact)
    if not svc.llm.configured:
        raise ProviderMissing(
            "conversation.compact needs an LLM provider to write the summary, and none is configured "
            "(LOOM_LLM=fake); set LOOM_LLM=openai, LOOM_LLM_URL and LOOM_LLM_MODEL",
            field="provider",
            rule="llm_required",
            provider="llm",
        )
    job_id = f"compact-{uuid.uuid4().hex}"
    # The job's owner key is written while the namespace is read (a refused request
    # leaves an unused key, which expires): one round trip less before the enqueue.
    config, _ = await asyncio.gather(
        namespace_ops.config(svc, ns),
        svc.redis.set(redis_keys.compact_job(job_id), ns, ex=_JOB_TTL_S),
    )
    if not config.model_calls_enabled:
        raise ModelCallsOff(
            "the namespace's model calls are switched off (namespace.set_policy); nothing was compacted",
            field="namespace",
            rule="model_calls_enabled",
        )
    job = await svc.arq.enqueue_job(
        COMPACT_JOB,
        jobs.build(
            jobs.CompactThreadJob,
            namespace=ns,
            agent=agent,
            thread_id=thread_id,
            keep_recent=ask.keep_recent,
            min_to_compact=ask.min_to_compact,
        ),
        _job_id=job_id,
        _queue_name=QUEUE,
    )
    if job is None:
        raise Unavailable("the compaction job could not be queued; retry", field="thread_id", rule="retry")
    await wake_workers(svc.redis)
    if ask.defer:
        return CompactResult(thread_id=thread_id, agent=agent, job_id=job_id)
    try:
        got = await _answer(svc, job)
    except TimeoutError:
        raise Unavailable(
            f"the compaction is still running; poll job {job_id}",
            field="thread_id",
            rule="retry",
            job_id=job_id,
        ) from None
    except Exception as exc:  # the job raised: its text stays in the log
        log.error("compaction job failed", error=failures.detail(exc), job_id=job_id)
        got = None
    return _from_job(got, job_id)


_DONE_TTL_S = 60
_POLL_S = 1.0  # between looks at arq's result, should no answer be pushed (a failed job)


async def push_answer(svc: Services, job_id: str, result: dict[str, Any]) -> None:
    """The job's answer, for the API awaiting it (worker side)."""
    pipe = svc.redis.pipeline(transaction=False)
    pipe.rpush(redis_keys.compact_done(job_id), json.dumps(result))
    pipe.expire(redis_keys.compact_done(job_id), _DONE_TTL_S)
    await pipe.execute()


async def _answer(svc: Services, job: Any) -> Any:
    """The job's answer: popped as soon as the worker pushes it (polling arq's result
    every few milliseconds would cost Redis and this process CPU for every compaction
    in flight, and add up to a poll interval to each answer). A job that failed pushes
    nothing: arq's result is looked at every _POLL_S. Raises TimeoutError past
    LOOM_COMPACT_WAIT_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + svc.settings.compact_wait_seconds
    key = redis_keys.compact_done(job.job_id)
    while (left := deadline - loop.time()) > 0:
        popped = await redis_calls.blpop(svc.redis, [key], min(_POLL_S, left))
        if popped is not None:
            return json.loads(popped[1])
        info = await job.result_info()
        if info is not None:
            if not info.success:
                raise info.result if isinstance(info.result, Exception) else RuntimeError("job failed")
            return info.result
    raise TimeoutError


def _from_job(got: Any, job_id: str) -> CompactResult:
    if not isinstance(got, dict) or "thread_id" not in got:
        raise Unavailable("the compaction job failed; retry", field="thread_id", rule="retry", job_id=job_id)
    return CompactResult(**{**got, "job_id": job_id})


@dataclass
class JobStatus:
    job_id: str
    state: str  # queued | in_progress | complete | not_found
    result: CompactResult | None = None


async def compact_status(svc: Services, who: Principal, namespace: str, job_id: str) -> JobStatus:
    """The state of a deferred compaction, and its answer once complete."""
    from arq.jobs import Job as ArqJob
    from arq.jobs import JobStatus as ArqStatus

    who.require_role(Role.writer)
    ns = who.namespace(namespace)
    owner = await svc.redis.get(redis_keys.compact_job(job_id))
    if owner is None or owner.decode() != ns:
        raise NotFound(f"no compaction job {job_id!r} in this namespace", field="job_id")
    job = ArqJob(job_id=job_id, redis=svc.arq, _queue_name=QUEUE)
    status = await job.status()
    if status == ArqStatus.complete:
        info = await job.result_info()
        result = _from_job(info.result if info is not None else None, job_id)
        return JobStatus(job_id, "complete", result)
    state = {ArqStatus.in_progress: "in_progress", ArqStatus.deferred: "queued", ArqStatus.queued: "queued"}
    return JobStatus(job_id, state.get(status, "not_found"))


def as_job_result(result: CompactResult) -> dict[str, Any]:
    return {k: v for k, v in asdict(result).items() if k != "job_id"}


__all__ = [
    "COMPACT_JOB",
    "CompactResult",
    "JobStatus",
    "Plan",
    "ProviderMissing",
    "compact",
    "announce",
    "compact_status",
    "plan",
    "run",
]
