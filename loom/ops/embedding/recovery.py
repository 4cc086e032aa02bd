"""The embedding recovery pass: user and assistant turns that landed with no embedding
row at all get one.

An append's embedding is written after its flush's insert, by a worker job the API
enqueued. A crash in between (the API, the worker, Redis or the store killed) leaves
acknowledged turns with no embedding row: a retried append answers duplicate and a
re-embed only rebuilds rows that exist, so nothing else would ever embed them. That is
unfinished work, not a failed embed: a failed embed has its error row, which records
it, and nothing retries it (neither does this pass).

The pass (at worker start-up and every LOOM_EMBED_RECOVERY_INTERVAL_SECONDS, an arq
cron job; one runner at a time across the pool, by a Redis lease):

1. reads, page by page, the transcript rows of embedded roles that were inserted after
   the position it reached last time (table embed_recovery) and at least the grace
   (``Settings.recovery_grace_seconds``) ago, by server insert time (created_at, pruned by
   a minmax index: a pass reads what landed since the last one, not the table). The
   very first pass (no position yet) sweeps what the table held then in key order
   instead, over as many passes as it takes;
2. leaves out tombstoned turns, turns that read as high (they never get an embedding
   row, and their text never reaches the model) and empty ones, then looks up the
   embedding rows of the rest by key: only turns with none at all are embedded;
3. calls the model (before any lease; pages of MODEL_TEXTS, so live appends sharing
   the worker's model are not held behind a backlog), then writes under the thread
   leases, re-checking each turn: one deleted meanwhile, or whose embedding row landed
   meanwhile, is left as it is (:func:`loom.ops.embedding.writer.write_recovered`).
   A failed model call is recorded as an append's would be (an error row);
4. saves its position after each page, so a pass cut short (MAX_PAGES, a crash) is
   continued by the next one. Every step can be repeated: a turn looked at twice is
   found embedded the second time.

An append's own job writes its vectors only while it is younger than the grace less a
margin, checked under the same thread lease: the pass and a late job never both write
one turn. Turns an import stored without embedding them are its own background pass's
(loom.ops.portability.windows): this pass leaves them alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from loom import logging as loom_logging
from loom import redis_keys
from loom.clock import next_version
from loom.jobs import EmbedTurn
from loom.leases import Lease, kept_renewed
from loom.ops.conversation.common import DELETED, EMBED_CHARS, EMBEDDED, FAILED, model_text, skipped
from loom.ops.embedding.writer import PRESENT, ModelFn, Outcome, write_recovered
from loom.ops.portability import windows
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embed_recovery as store
from loom.store import embeddings as emb_store
from loom.store.keys import EmbKey

log = loom_logging.get("loom.conversation.recovery")

LEASE_KEY = redis_keys.EMBED_RECOVERY_LEASE
LEASE_TTL_MS = 30_000
PAGE = 1_000  # transcript rows read per page
MAX_PAGES = 20  # per pass (~20k rows); the next pass goes on from the saved position
MODEL_TEXTS = 32  # texts per model request


@dataclass(kw_only=True)
class RecoveryReport:
    ran: bool = False  # False: another runner held the lease
    scanned: int = 0  # transcript rows looked at
    embedded: int = 0
    failed: int = 0  # the model failed: an error row records it
    skipped_present: int = 0  # an embedding row was there (or landed meanwhile)
    skipped_high: int = 0
    skipped_deleted: int = 0
    skipped_empty: int = 0
    skipped_import: int = 0  # an import's turns: its own background pass embeds them
    caught_up: bool = False  # reached the grace horizon (else the next pass goes on)

    def counts(self) -> dict[str, int | bool]:
        return asdict(self)


@dataclass(kw_only=True)
class _Pass:
    """One pass's fixed inputs, handed down its steps."""

    svc: Services
    model: ModelFn
    grace: float
    page: int
    keeper: asyncio.Task[None]  # done: the lease was lost, another runner may be going on
    report: RecoveryReport


async def recover(
    svc: Services,
    model: ModelFn,
    *,
    grace_s: float | None = None,
    page: int = PAGE,
    max_pages: int = MAX_PAGES,
) -> RecoveryReport:
    """One pass, if no other runner holds the lease (else a report with ran=False)."""
    report = RecoveryReport()
    lease = Lease(svc.redis, LEASE_KEY, LEASE_TTL_MS)
    if not await lease.try_acquire():
        return report
    report.ran = True
    async with kept_renewed(lease, "embed-recovery-lease") as keeper:
        grace = svc.settings.recovery_grace_seconds if grace_s is None else grace_s
        run = _Pass(svc=svc, model=model, grace=grace, page=page, keeper=keeper, report=report)
        await _pass(run, max_pages)
    return report


async def _pass(run: _Pass, max_pages: int) -> None:
    svc = run.svc
    pos = await svc.run(store.position, svc.ch)
    if pos is None:
        pos, max_pages = await _first_pass(run, max_pages)
        if pos is None:
            return
    upto = await svc.run(store.horizon, svc.ch, run.grace)
    for _ in range(max_pages):
        if run.keeper.done():
            return
        rows = await svc.run(store.landed_after, svc.ch, pos, upto, limit=run.page, chars=EMBED_CHARS)
        run.report.scanned += len(rows)
        if rows:
            await _recover(svc, run.model, rows, run.report)
            pos = rows[-1].position
            await svc.run(store.save_position, svc.ch, pos, next_version())
        if len(rows) < run.page:
            run.report.caught_up = True
            return


async def _first_pass(run: _Pass, max_pages: int) -> tuple[store.Position | None, int]:
    """With no position yet (a new deployment, or one whose turns predate the pass):
    every turn inserted up to the horizon of the first pass, in key order, over as many
    passes as it takes. Then the position in insert-time order starts at that horizon.
    Returns it and the pages left for this pass (None: not done yet)."""
    svc = run.svc
    sweep = await svc.run(store.position, svc.ch, store.SWEEP)
    if sweep is None:  # fixed for the whole sweep, whichever passes carry it out
        sweep = store.Position(created_at=await svc.run(store.horizon, svc.ch, run.grace))
        await svc.run(store.save_position, svc.ch, sweep, next_version(), store.SWEEP)
    for used in range(max_pages):
        if run.keeper.done():
            break
        rows = await svc.run(store.landed_in_key_order, svc.ch, sweep, limit=run.page, chars=EMBED_CHARS)
        run.report.scanned += len(rows)
        if rows:
            await _recover(svc, run.model, rows, run.report)
            sweep = replace(rows[-1].position, created_at=sweep.created_at)
            await svc.run(store.save_position, svc.ch, sweep, next_version(), store.SWEEP)
        if len(rows) < run.page:
            start = store.Position(created_at=sweep.created_at)
            await svc.run(store.save_position, svc.ch, start, next_version())
            return start, max_pages - used - 1
    return None, 0


async def _recover(
    svc: Services, model: ModelFn, rows: Sequence[store.Landed], report: RecoveryReport
) -> None:
    imports = await windows.read(svc.redis)
    if imports:
        mine = [
            r
            for r in rows
            if not windows.covered(imports, r.position.namespace, r.appended_by, r.position.created_at)
        ]
        report.skipped_import += len(rows) - len(mine)
        rows = mine
    missing = await to_embed(svc, rows, report)
    for lo in range(0, len(missing), MODEL_TEXTS):
        turns = [as_embed_turn(r) for r in missing[lo : lo + MODEL_TEXTS]]
        result = await model(model_texts(svc, turns))  # provider work before any lease
        tally(await write_recovered(svc, turns, result), report)


def model_texts(svc: Services, turns: Sequence[EmbedTurn]) -> list[str]:
    prefix = svc.settings.embed_speaker_prefix
    return [model_text(t.text, t.role, t.is_summary, prefix, t.speaker) for t in turns]


async def to_embed(svc: Services, rows: Sequence[store.Landed], report: RecoveryReport) -> list[store.Landed]:
    """Of `rows`, the live turns to embed: not tombstoned (now), not high, not empty, and
    with no embedding row at all (each counted in `report` otherwise)."""
    todo: dict[EmbKey, store.Landed] = {}
    for r in rows:
        if r.tombstoned:
            report.skipped_deleted += 1
        elif r.high_sensitivity or reads_as_high(r.text):
            report.skipped_high += 1  # never an embedding row, never sent to the model
        elif not r.text.strip():
            report.skipped_empty += 1
        else:
            todo.setdefault(r.emb_key, r)  # a turn's copies (agents) share one embedding row
    if not todo:
        return []
    present = await svc.run(emb_store.states, svc.ch, list(todo))
    missing = [r for key, r in todo.items() if key not in present]
    report.skipped_present += len(todo) - len(missing)
    # A page reads every version of a row: a turn tombstoned since (a newer version,
    # perhaps inserted after the horizon) must not reach the model on its older one.
    now = await svc.run(conv_store.states, svc.ch, [r.turn_key for r in missing])
    live = [r for r in missing if (st := now.get(r.turn_key)) is not None and not st.tombstoned]
    report.skipped_deleted += len(missing) - len(live)
    return live


def as_embed_turn(r: store.Landed) -> EmbedTurn:
    p = r.position
    return EmbedTurn(
        p.namespace,
        p.agent,
        p.thread_id,
        p.msg_id,
        r.role,
        r.run_id,
        r.user_id,
        r.ts,
        r.text,
        r.is_summary,
        r.speaker,
    )


def tally(outcomes: Sequence[Outcome], report: RecoveryReport) -> None:
    for o in outcomes:
        status = o.status
        if status == EMBEDDED:
            report.embedded += 1
        elif status == FAILED:
            report.failed += 1
        elif status == skipped(DELETED):
            report.skipped_deleted += 1
        elif status == skipped(PRESENT):
            report.skipped_present += 1


__all__ = ["LEASE_KEY", "RecoveryReport", "as_embed_turn", "model_texts", "recover", "tally", "to_embed"]
