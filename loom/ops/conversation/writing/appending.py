"""conversation.append: the write path of the conversation plane.

An append is answered only when its turn is durable, and then with its embedding's
outcome. To afford that at thousands of turns a second, turns from concurrent requests
share their ClickHouse round trips (a one-row insert costs the engine 7-10 ms):

1. The op derives what needs no I/O (msg_id, ts) and queues the turns on the
   process's append buffers (:class:`loom.store.write_buffer.Batcher`, flushed by size,
   LOOM_WRITE_BATCH_MAX_ROWS, and age: LOOM_WRITE_BATCH_MAX_WAIT_MS for system and tool
   turns, LOOM_WRITE_BATCH_EMBED_WAIT_MS for user and assistant turns, which wait for
   their embedding anyway).
2. A flush reads the recording switch of every namespace in the batch (cached in Redis:
   loom.store.recording_cache) and,
   at the same time, in one atomic Redis script (loom.store.landed), claims each turn
   (SET NX with a TTL, key per (namespace, agent, thread_id, msg_id): of two concurrent
   flushes carrying the same turn, in this process or another, exactly one wins) and
   notes it among the turns that may have landed. A claim is trusted only while its
   flush is live (a mark the flush renews while it runs: FLUSH_LIVE_MS): the claim of a
   flush whose process died between its claim and its insert is taken over by the next
   flush of that turn, which then reads ClickHouse for it like any re-log. A turn whose
   claim a live flush holds is answered duplicate only once its row has landed; until
   then the flush waits (CONTEST_WAIT_S, then 503), so that no append is told its turn
   is stored while the only flush carrying it may still fail or die. A save storing a
   new message claims the turn the same way and is live the same way
   (loom.ops.conversation.saved.saving): its claim is waited on while it lives, taken over
   once it died.
3. The notes answer "certainly new" for most turns; only the others (noted before: a
   re-log; or a namespace whose notes are still being rebuilt) are looked up in
   ClickHouse, for any agent: a turn that another agent's copy landed for may have a
   vector to reuse, and only for such turns (rare) are the embedding rows read, beside
   the insert. The claim covers the window until the row is readable; the notes and
   ClickHouse cover everything older (claims expire).
4. The turns to embed (user and assistant turns, stored, not reading as high) leave as
   one arq job for the whole flush *before* the insert, behind an insert gate: the
   model works while the rows are inserted, and the worker writes the vectors only
   once the flush opened the gate (the rows are durable; none if the insert failed).
   Each append then awaits its own turns' outcomes (see
   :mod:`loom.ops.embedding.client`). Turns another agent logged too wait for
   the insert and its read of their embedding rows (their vector may be reused).
5. It inserts the batch's rows with ONE INSERT carrying an insert_deduplication_token
   (a retried insert cannot double them) and, at the same time, one for the threads
   this process has not written a row for yet (an append's thread row needs no read:
   see loom.store.threads.append_version). If the insert fails, the claims are
   released, the gate is shut and the callers get the error.

An import (loom.ops.portability) stores its turns through this same path with
``embed=False``: everything above holds but step 4, which it leaves to its own
background pass (the turns are answered ``embedding: "deferred"``); its claims live
IMPORT_CLAIM_TTL_S, since an import's thousands of turns a second would otherwise keep
an hour of claims in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from clickhouse_connect.driver.exceptions import OperationalError
from prometheus_client import Counter, Histogram

from loom import failures, redis_keys
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import InvalidRequest, LoomError, Unavailable
from loom.jobs import EmbedTurn
from loom.leases import Lease
from loom.models.conversation.reading import TurnIn
from loom.ops.conversation.common import (
    DELETED,
    DUPLICATE,
    EMBEDDED,
    EMBEDDED_ROLES,
    ERASED,
    FAILED,
    LOGGING_DISABLED,
    ROLES,
    SPEAKER,
    TURN_KEY,
    derive_msg_id,
    embed_text,
    picked,
    skipped,
)
from loom.ops.conversation.writing import origin
from loom.ops.embedding.client import EmbedClient, open_gate
from loom.ops.embedding.writer import Outcome
from loom.sensitivity import reads_as_high
from loom.services import Services, Slot
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import fences, landed, recording_cache
from loom.store import namespaces as ns_store
from loom.store import threads as thread_store
from loom.store.keys import EmbKey, ThreadKey, TurnKey, UserKey
from loom.store.transcript_postings import speaker_of
from loom.store.write_buffer import Batcher, FlushFn

log = loom_logging.get("loom.conversation.append")

FLUSH_ROWS = Histogram(
    "loom_append_flush_rows",
    "Turns per append flush",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
)
FLUSH_SECONDS = Histogram(
    "loom_append_flush_seconds",
    "Append flush stages",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
APPENDED = Counter("loom_append_turns_total", "Appended turns by outcome", ["outcome"])
# What an append answered for each turn's embedding: embedded, failed, skipped:<why>.
EMBEDDINGS = Counter("loom_append_embeddings_total", "Appended turns by embedding outcome", ["outcome"])

CLAIM_TTL_S = 3_600
IMPORT_CLAIM_TTL_S = 300  # longer than any flush lives; the notes and ClickHouse cover the rest
DEFERRED = "deferred"  # an import's turn: its background pass embeds it (loom.ops.portability)
CLAIM_PREFIX = redis_keys.TURN_CLAIM
# A flush is live while its mark lives (loom.store.landed.claim_and_note): the mark is
# renewed every FLUSH_RENEW_S while the flush runs, and lapses FLUSH_LIVE_MS after its
# process died or stalled. A claim whose flush is not live is taken over.
FLUSH_LIVE_MS = 5_000
FLUSH_RENEW_S = 1.0
# How long a flush waits on a turn another live flush claimed, for its row to land or
# its claim to be released or to lapse (longer than FLUSH_LIVE_MS, so that a flush that
# died is always outlived). Past it the append answers 503: retry.
CONTEST_WAIT_S = 12.0
CONTEST_POLL_S = (0.01, 0.25)  # the first and the longest pause between looks
REBUILD_LEASE_S = 600
KNOWN_THREADS = 100_000  # threads this process remembers having written a row for
_RELEASE_CLAIM = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclass(kw_only=True)
class AppendResult:
    thread_id: str
    msg_id: str
    role: str
    stored: bool
    reason: str | None = None
    embedding: str = ""
    embedding_error: str | None = None


@dataclass
class _Flushed:
    stored: bool
    reason: str | None = None
    high: bool = False
    embed: asyncio.Future[Outcome] | None = None
    reused: bool = False
    saved_only: bool = (
        False  # a duplicate of a row that may be saved-only (see loom.ops.conversation.writing.origin)
    )


def claim_key(key: TurnKey) -> str:
    """Per turn, under its namespace's prefix (an erasure of the namespace finds them)."""
    h = hashlib.sha256("\x00".join(key).encode()).hexdigest()[:40]
    return redis_keys.turn_claim(key[0], h)


class AppendPipeline:
    """Per process (kept in ``svc.extras``): the append buffer and the embedding client."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        cfg = svc.settings
        self.buffer = self._batcher(self._flush, "conversation-append", cfg.write_batch_max_wait_ms)
        # User and assistant turns have a buffer of their own with a longer window
        # (LOOM_WRITE_BATCH_EMBED_WAIT_MS): they wait for their embedding anyway, and a
        # flush that gathers all of a round's concurrent appends costs one insert and
        # one embedding job (each ~10-50 ms of the engine's CPU, which the model lacks)
        # instead of several. System and tool turns keep the short window.
        self.embed_buffer = self._batcher(
            self._flush,
            "conversation-append-embedded",
            cfg.write_batch_embed_wait_ms,
            quiet_ms=cfg.write_batch_embed_quiet_ms,
        )
        # An import's turns (embed=False): no embedding job, so no wait for one.
        self.import_buffer = self._batcher(
            self._flush_unembedded, "conversation-import", cfg.write_batch_max_wait_ms, max_inflight=2
        )
        self.embedder = EmbedClient(svc)
        self._known_threads: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._rebuilding: set[str] = set()
        self._flushing: set[str] = set()  # the writers running: their live marks are renewed
        self._renewer: asyncio.Task[None] | None = None

    def _batcher(
        self,
        flush: FlushFn[conv_store.Turn, _Flushed],
        name: str,
        wait_ms: float,
        *,
        quiet_ms: float = 0.0,
        max_inflight: int = 4,
    ) -> Batcher[conv_store.Turn, _Flushed]:
        """A buffer of turns flushed by `flush`, at most the configured rows per batch."""
        return Batcher(
            flush,
            max_items=self.svc.settings.write_batch_max_rows,
            max_wait_s=wait_ms / 1000.0,
            quiet_s=quiet_ms / 1000.0 or None,
            max_inflight=max_inflight,
            name=name,
        )

    async def close(self) -> None:
        await self.buffer.close()
        await self.embed_buffer.close()
        await self.import_buffer.close()
        await self.embedder.close()
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def _submit(self, turns: Sequence[conv_store.Turn], embed: bool) -> list[_Flushed]:
        """Each turn through its role's buffer; the results in the order of `turns`."""
        if not embed:
            return await self.import_buffer.submit_many(turns)
        embedded = [i for i, t in enumerate(turns) if t.role in EMBEDDED_ROLES]
        if not embedded:
            return await self.buffer.submit_many(turns)
        if len(embedded) == len(turns):
            return await self.embed_buffer.submit_many(turns)
        others = [i for i, t in enumerate(turns) if t.role not in EMBEDDED_ROLES]
        got_embedded, got_others = await asyncio.gather(
            self.embed_buffer.submit_many([turns[i] for i in embedded]),
            self.buffer.submit_many([turns[i] for i in others]),
        )
        by_index = dict(zip(embedded + others, got_embedded + got_others, strict=True))
        return [by_index[i] for i in range(len(turns))]

    async def append(self, turns: Sequence[conv_store.Turn], *, embed: bool = True) -> list[AppendResult]:
        """Store `turns`; with embed=False (an import) none is sent to the model."""
        flushed = await self._submit(turns, embed)
        # A duplicate of a saved-only row, in a namespace that records: the row becomes
        # recorded (rare: only turns a save stored are looked at).
        upgrade = [t.key for t, f in zip(turns, flushed, strict=True) if f.saved_only]
        gone = await origin.record_saved(self.svc, upgrade) if upgrade else set()
        results = []
        for turn, f in zip(turns, flushed, strict=True):
            res = AppendResult(
                thread_id=turn.thread_id, msg_id=turn.msg_id, role=turn.role, stored=f.stored, reason=f.reason
            )
            if turn.key in gone:
                res.reason = DELETED  # an unsave removed the saved-only row first
            if not f.stored:
                res.embedding = skipped(res.reason or "not_stored")
            elif f.reused:
                res.embedding = EMBEDDED
            elif not embed and _embeddable(turn) and not turn.tombstoned:
                res.embedding = DEFERRED
            elif f.embed is None:
                res.embedding = skipped(_why_not_embedded(turn, f.high))
            else:
                outcome = await asyncio.shield(f.embed)
                res.embedding = outcome.status
                if outcome.status == skipped(DELETED):
                    res.stored, res.reason = False, DELETED
                elif outcome.status == FAILED:
                    res.embedding_error = failures.safe(outcome.error)  # a code, never a driver's text
            results.append(res)
        # One increment per outcome, not per turn (a label lookup costs more than the rest
        # of a turn's answer, and an import answers thousands at a time).
        for outcome_name, n in Tally(r.embedding for r in results).items():
            EMBEDDINGS.labels(outcome_name).inc(n)
        return results

    # -- the flush -------------------------------------------------------------

    async def _flush_unembedded(self, turns: list[conv_store.Turn]) -> list[_Flushed]:
        return await self._flush(turns, embed=False)

    async def _flush(self, turns: list[conv_store.Turn], *, embed: bool = True) -> list[_Flushed]:
        try:
            return await self._flush_batch(_Batch.of(turns, embed=embed))
        except LoomError:
            raise
        except Exception as exc:
            # The store or Redis failed: nothing of the batch was kept (claims released);
            # a retry is safe (same msg_ids: nothing can land twice).
            log.warning("append flush failed", error=failures.detail(exc), turns=len(turns))
            raise Unavailable(
                f"the conversation store did not take the turns ({type(exc).__name__}); retry the append"
            ) from exc

    async def _flush_batch(self, batch: _Batch) -> list[_Flushed]:
        """The flush, live (its claims are trusted) until it returns or raises."""
        async with self.live(batch.flush_id):
            return await self._flush_live(batch)

    @contextlib.asynccontextmanager
    async def live(self, writer_id: str) -> AsyncIterator[None]:
        """Keep a writer of turns live while inside: a flush (its id), or a save
        (loom.ops.conversation.saved.saving: its claim value). Its mark, set when it claims
        (loom.store.landed.claim_and_note), is renewed every FLUSH_RENEW_S, so its claims
        are waited on, never taken over; once it returns or raises (or its process
        dies) the mark lapses within FLUSH_LIVE_MS, and its claims are taken over."""
        self._flushing.add(writer_id)
        self._keep_renewing()
        try:
            yield
        finally:
            self._flushing.discard(writer_id)

    def _keep_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew(), name="append-flush-live")

    async def _renew(self) -> None:
        """Renew the live marks of the running flushes until the pipeline closes."""
        while True:
            await asyncio.sleep(FLUSH_RENEW_S)
            if not self._flushing:
                continue
            try:
                await landed.keep_live(self.svc.redis, list(self._flushing), FLUSH_LIVE_MS)
            except Exception as exc:  # a flush outliving its mark may be taken over: a second version
                log.warning("could not renew the append flushes' live marks", error=failures.detail(exc))

    async def _flush_live(self, batch: _Batch) -> list[_Flushed]:
        """The steps of a flush (see the module docstring): claim and note the batch's
        turns while reading the recording switches, sort out which are stored, send
        those to the model while they are inserted, then embed the ones another
        agent's copy landed for (or reuse its vector)."""
        turns = batch.turns
        FLUSH_ROWS.observe(len(turns))
        started = time.perf_counter()
        claimed = await self._claim(batch)
        FLUSH_SECONDS.labels("state").observe(time.perf_counter() - started)
        out, stored, release = _sort_out(batch, claimed)
        if release:
            await self.release(release, batch.flush_id)
        vectors: dict[EmbKey, str] = {}
        shared: set[EmbKey] = set()
        if stored:
            stored, vectors, shared = await self._store(batch, stored, claimed.state, out)
        later = _after_insert(out, turns, stored, vectors, shared)
        self._embed(out, turns, later if batch.embed else [], gate=None)
        FLUSH_SECONDS.labels("total").observe(time.perf_counter() - started)
        for outcome_name, n in Tally("stored" if f.stored else str(f.reason) for f in out).items():
            APPENDED.labels(outcome_name).inc(n)
        return out

    async def _claim(self, batch: _Batch) -> _Claimed:
        """Claim and note the batch's distinct turns and read the recording switches
        (independent: one round trip each, at once), settle the turns another live
        flush holds, then which claimed turns landed already. On a failure the claims
        are released (else a retry would read as a duplicate)."""
        unique = batch.unique
        namespaces = list(dict.fromkeys(k[0] for k in unique))
        recording_or_error, noted_or_error = await asyncio.gather(
            self._recording(namespaces),
            self._claim_keys(unique, batch.flush_id, CLAIM_TTL_S if batch.embed else IMPORT_CLAIM_TTL_S),
            return_exceptions=True,
        )
        if isinstance(noted_or_error, BaseException):
            raise noted_or_error
        noted = dict(zip(unique, noted_or_error, strict=True))
        try:
            if isinstance(recording_or_error, BaseException):
                raise recording_or_error
            recording = recording_or_error
            contested = [k for k, n in noted.items() if n.contested and k[0] in recording]
            if contested:
                await self._settle(contested, batch.flush_id, noted)
            state = await self._landed(noted, recording)
        except BaseException:
            await self.release([k for k, n in noted.items() if n.claimed], batch.flush_id)
            raise
        return _Claimed(recording, noted, {k for k, n in noted.items() if n.claimed}, state)

    async def _claim_keys(
        self, keys: list[TurnKey], flush_id: str, ttl_s: int = CLAIM_TTL_S
    ) -> list[landed.Noted]:
        return await landed.claim_and_note(
            self.svc.redis, keys, [claim_key(k) for k in keys], flush_id, ttl_s, FLUSH_LIVE_MS
        )

    async def _settle(
        self,
        contested: list[TurnKey],
        flush_id: str,
        noted: dict[TurnKey, landed.Noted],
    ) -> None:
        """Turns another live writer claimed: a concurrent append of the same turn, a
        retry of one whose flush may still be inserting it (or died: its live mark
        lapses within FLUSH_LIVE_MS), or a save storing it. Answered duplicate only once
        their row has landed; claimed here (`noted` updated) once the other writer
        released or outlived its claim. Rare (duplicates only), so polling."""
        svc, loop = self.svc, asyncio.get_running_loop()
        deadline = loop.time() + CONTEST_WAIT_S
        pause, longest = CONTEST_POLL_S
        pending = contested
        while True:
            existing = (await svc.run(conv_store.landed, svc.ch, pending)).existing
            pending = [k for k in pending if k not in existing]  # landed: a duplicate
            if not pending:
                return
            if loop.time() >= deadline:
                raise Unavailable("another append of the same turn has not finished; retry the append")
            await landed.mark_waiting(svc.redis, flush_id)  # again: a claim attempt marks it live only
            await self._no_wait_cycle(pending, flush_id)
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)
            again = dict(zip(pending, await self._claim_keys(pending, flush_id), strict=True))
            noted.update(again)  # the latest holder: a save's row that lands may be saved-only
            pending = [k for k, n in again.items() if n.contested]
            if not pending:
                return

    async def _store(
        self,
        batch: _Batch,
        stored: list[int],
        state: conv_store.Landed,
        out: list[_Flushed],
    ) -> tuple[list[int], dict[EmbKey, str], set[EmbKey]]:
        """Screen the stored turns, send those no other agent logged to the model behind
        the insert gate, insert the rows (reading the vectors another agent's copy may
        have, beside it), drop the turns a delete fenced, and open the gate. Returns the
        turns still stored, the live texts read and the keys they were read for."""
        svc, turns = self.svc, batch.turns
        await svc.run(_screen, [turns[i] for i in stored])
        shared = _shared_keys([turns[i] for i in stored], state.elsewhere)
        # Turns no other agent logged (nearly all) are sent to the model now, while
        # their rows are inserted: the worker writes their vectors once the gate says
        # the rows are durable (loom.ops.embedding.client.open_gate).
        early = [
            i for i in stored if batch.embed and _embeddable(turns[i]) and _emb_key(turns[i]) not in shared
        ]
        gate = batch.flush_id if early else None
        self._embed(out, turns, early, gate=gate)
        vectors = await self._insert_reading(batch, stored, shared, gate)
        stored = await self._drop_fenced(turns, stored, out)
        await self._open_gate(gate, durable=True)
        return stored, vectors, shared

    async def _insert_reading(
        self, batch: _Batch, stored: list[int], shared: set[EmbKey], gate: str | None
    ) -> dict[EmbKey, str]:
        """The insert; the vectors to reuse are read beside it, and only for the turns
        another agent logged too (rare): no read of embedding rows otherwise. If it
        fails, the claims are released and the gate shut."""
        svc, rows = self.svc, [batch.turns[i] for i in stored]
        vectors: dict[EmbKey, str] = {}
        t0 = time.perf_counter()
        try:
            if shared:
                vectors, _ = await asyncio.gather(
                    svc.run(emb_store.live_texts, svc.ch, sorted(shared)), self._insert(rows, batch.flush_id)
                )
            else:
                await self._insert(rows, batch.flush_id)
        except BaseException:
            await self.release([t.key for t in rows], batch.flush_id)
            await self._open_gate(gate, durable=False)
            raise
        FLUSH_SECONDS.labels("insert").observe(time.perf_counter() - t0)
        return vectors

    async def _drop_fenced(
        self, turns: list[conv_store.Turn], stored: list[int], out: list[_Flushed]
    ) -> list[int]:
        """After the insert, before any vector can be written: turns of a thread that a
        conversation.delete began on before they were stamped, and turns of a user whose
        erasure began before they were stamped, are tombstoned here and answered deleted
        (loom.store.fences says why this closes both races)."""
        threads = list(
            dict.fromkeys(ThreadKey(turns[i].namespace, turns[i].agent, turns[i].thread_id) for i in stored)
        )
        users = list(
            dict.fromkeys(UserKey(turns[i].namespace, turns[i].user_id) for i in stored if turns[i].user_id)
        )
        try:
            found, erased = await fences.all_fences(self.svc.redis, threads, users)
        except Exception as exc:  # the delete's own read still covers every row that landed before it
            log.warning("could not read the deletion fences", error=f"{type(exc).__name__}: {exc}")
            return stored
        reasons: dict[int, str] = {}
        for i in stored:
            t = turns[i]
            if t.version < found.get(ThreadKey(t.namespace, t.agent, t.thread_id), 0):
                reasons[i] = DELETED
            elif t.user_id and t.version < erased.get(UserKey(t.namespace, t.user_id), 0):
                reasons[i] = ERASED
        if not reasons:
            return stored
        now = utcnow()
        rows = [
            replace(
                turns[i], tombstoned=True, tombstoned_at=now, tombstone_reason=reason, version=next_version()
            )
            for i, reason in sorted(reasons.items())
        ]
        await self.svc.run(conv_store.insert, self.svc.ch, rows)
        for i in reasons:
            out[i] = _Flushed(False, DELETED)
        return [i for i in stored if i not in reasons]

    def _embed(
        self, out: list[_Flushed], turns: list[conv_store.Turn], idxs: list[int], *, gate: str | None
    ) -> None:
        """One job for the turns at `idxs`; each turn answered as its part is written."""
        if not idxs:
            return
        futures = self.embedder.embed([_embed_turn(turns[i]) for i in idxs], gate=gate)
        for i, fut in zip(idxs, futures, strict=True):
            out[i].embed = fut

    async def _open_gate(self, gate: str | None, *, durable: bool) -> None:
        if gate is None:  # no job waits on this flush's insert
            return
        try:
            await open_gate(self.svc.redis, gate, durable=durable)
        except Exception as exc:
            # The rows are as the insert left them; the worker gives up on its own, and
            # the API records the embedding error when its wait runs out (fail-open).
            log.warning("could not open the embedding gate", error=failures.detail(exc))

    async def _recording(self, namespaces: list[str]) -> set[str]:
        """The namespaces that record: from the Redis cache, from ClickHouse on a miss."""
        svc = self.svc
        switches = await recording_cache.cached(svc.redis, namespaces)
        missed = [ns for ns, on in switches.items() if on is None]
        if missed:
            read = await svc.run(ns_store.recording, svc.ch, missed)
            fresh = {ns: ns in read for ns in missed}
            await recording_cache.remember(svc.redis, fresh)
            switches.update(fresh)
        return {ns for ns, on in switches.items() if on}

    async def _landed(self, noted: dict[TurnKey, landed.Noted], recording: set[str]) -> conv_store.Landed:
        """Which of the claimed turns of recording namespaces already landed: from
        ClickHouse for the turns the notes cannot rule out (see loom.store.landed), none
        at all for the rest. A namespace whose notes are not complete gets them rebuilt."""
        maybe = [k for k, n in noted.items() if n.claimed and k[0] in recording and not n.certainly_new]
        state = (
            await self.svc.run(conv_store.landed, self.svc.ch, maybe)
            if maybe
            else conv_store.Landed(set(), set())
        )
        # A turn noted before for another agent only: its copy may have a vector to reuse.
        state.elsewhere |= {
            EmbKey(k.namespace, k.thread_id, k.msg_id)
            for k, n in noted.items()
            if n.certainly_new and not n.first_any
        }
        for ns in {k[0] for k, n in noted.items() if not n.ready and k[0] in recording}:
            self._rebuild_notes(ns)
        return state

    def _rebuild_notes(self, namespace: str) -> None:
        if namespace in self._rebuilding:
            return
        self._rebuilding.add(namespace)
        task = asyncio.get_running_loop().create_task(
            self._rebuild(namespace), name=f"landed-notes-{namespace}"
        )
        task.add_done_callback(lambda _: self._rebuilding.discard(namespace))

    async def _rebuild(self, namespace: str) -> None:
        """Note every turn the namespace holds, then mark its notes complete. One process
        at a time per namespace (a lease); the others keep reading ClickHouse."""
        svc = self.svc
        lease = Lease(svc.redis, redis_keys.landed_rebuilding(namespace), ttl_ms=REBUILD_LEASE_S * 1000)
        try:
            if not await lease.try_acquire():
                return
            since = await landed.run_id(svc.redis)
            after: TurnKey | None = None
            while True:
                page = await svc.run(landed.key_page, svc.ch, namespace, after)
                if not page:
                    break
                await landed.note(svc.redis, page)
                after = page[-1]
            await landed.mark_ready(svc.redis, namespace, since)
        except Exception as exc:  # the namespace keeps reading ClickHouse; the next flush retries
            log.warning(
                "could not rebuild the landed-turn notes", namespace=namespace, error=failures.detail(exc)
            )
        finally:
            with contextlib.suppress(Exception):
                await lease.release()

    async def _no_wait_cycle(self, pending: list[TurnKey], flush_id: str) -> None:
        """Two flushes each holding a turn the other carries would wait on each other
        until CONTEST_WAIT_S: a waiting flush whose turn is held by another waiting
        flush with a smaller id gives up at once (its claims are released, its callers
        answered 503: retry), so in any such cycle one gives up and the others go on."""
        holders = await landed.waiting_holders(self.svc.redis, [claim_key(k) for k in pending])
        if any(h and h < flush_id for h in holders):
            raise Unavailable("two appends carry the same turns and wait on each other; retry the append")

    async def release(self, keys: list[TurnKey], flush_id: str) -> None:
        """Release the claims `flush_id` (a flush, or a save) still holds on `keys`."""
        try:
            pipe = self.svc.redis.pipeline(transaction=False)
            for key in keys:
                pipe.eval(_RELEASE_CLAIM, 1, claim_key(key), flush_id)
            await pipe.execute()
        except Exception as exc:  # the claims then expire on their own
            log.warning("could not release append claims", error=failures.detail(exc))

    def _new_threads(self, turns: list[conv_store.Turn]) -> list[thread_store.ThreadRow]:
        """Rows for the threads of `turns` this process has not written one for yet.

        No read is needed: an append's thread row is versioned below every explicit
        write and above later append rows (see loom.store.threads.append_version), so
        writing it again, from this process or another, changes nothing."""
        rows: dict[tuple[str, str, str], thread_store.ThreadRow] = {}
        for t in turns:
            tkey = (t.namespace, t.agent, t.thread_id)
            if tkey not in rows and tkey not in self._known_threads:
                rows[tkey] = thread_store.ThreadRow(
                    namespace=t.namespace,
                    agent=t.agent,
                    thread_id=t.thread_id,
                    created_at=t.ts,
                    version=thread_store.append_version(t.ts),
                )
        return list(rows.values())

    def _remember_threads(self, rows: list[thread_store.ThreadRow]) -> None:
        for r in rows:
            self._known_threads[(r.namespace, r.agent, r.thread_id)] = None
        while len(self._known_threads) > KNOWN_THREADS:
            self._known_threads.popitem(last=False)

    async def _insert(self, turns: list[conv_store.Turn], flush_id: str) -> None:
        """Screen the texts, then the batch's inserts: one for the turns and, at the same
        time, one for the threads this process has not seen yet."""
        svc = self.svc

        def insert_turns() -> None:
            _with_retry(lambda: conv_store.insert(svc.ch, turns, dedup_token=f"conv-{flush_id}"))

        threads = self._new_threads(turns)
        if not threads:
            await svc.run(insert_turns)
            return
        await asyncio.gather(
            svc.run(insert_turns),
            svc.run(_with_retry, lambda: thread_store.insert(svc.ch, threads, dedup_token=f"thr-{flush_id}")),
        )
        self._remember_threads(threads)


@dataclass
class _Batch:
    """One flush's turns, its id (claims' value, gate, dedup tokens) and each distinct
    key's first index (a key seen again in the batch is a duplicate)."""

    turns: list[conv_store.Turn]
    flush_id: str
    first: dict[TurnKey, int]
    embed: bool = True  # False: an import's turns, embedded later by its own pass

    @classmethod
    def of(cls, turns: list[conv_store.Turn], *, embed: bool = True) -> _Batch:
        first: dict[TurnKey, int] = {}
        for i, t in enumerate(turns):
            first.setdefault(t.key, i)
        return cls(turns, uuid.uuid4().hex, first, embed)

    @property
    def unique(self) -> list[TurnKey]:
        return list(self.first)


@dataclass
class _Claimed:
    """What the claim step found: the recording namespaces, each turn's note, the
    turns this flush claimed, and which of them landed already."""

    recording: set[str]
    noted: dict[TurnKey, landed.Noted]
    claimed: set[TurnKey]
    state: conv_store.Landed


def _sort_out(batch: _Batch, c: _Claimed) -> tuple[list[_Flushed], list[int], list[TurnKey]]:
    """Each turn's answer so far, the indexes of the turns to store, and the claims not
    needed (a namespace that does not record; a turn that landed already)."""
    out: list[_Flushed] = []
    stored: list[int] = []
    release: list[TurnKey] = []
    for i, t in enumerate(batch.turns):
        first = batch.first[t.key] == i
        if t.namespace not in c.recording:
            out.append(_Flushed(False, LOGGING_DISABLED))
            if first and t.key in c.claimed:
                release.append(t.key)
        elif not first or t.key in c.state.existing or t.key not in c.claimed:
            # The turn landed already (or a save holds it); a saved-only row of it is
            # made recorded by the append that carried it (after the flush, under the
            # thread lease).
            maybe_saved = first and (t.key in c.state.saved_only or c.noted[t.key].held_by_save)
            out.append(_Flushed(False, DUPLICATE, saved_only=maybe_saved))
            if first and t.key in c.claimed:
                release.append(t.key)  # an older row: the claim was not needed
        else:
            out.append(_Flushed(True))
            stored.append(i)
    return out, stored, release


def _after_insert(
    out: list[_Flushed],
    turns: list[conv_store.Turn],
    stored: list[int],
    vectors: dict[EmbKey, str],
    shared: set[EmbKey],
) -> list[int]:
    """Notes each stored turn's screen on its answer; of the turns another agent's copy
    landed for, those whose vector is reused are answered, and the others returned
    (to be embedded now that their embedding rows were read)."""
    later: list[int] = []
    for i in stored:
        t = turns[i]
        out[i].high = t.high_sensitivity
        if not _embeddable(t) or _emb_key(t) not in shared:
            continue
        if vectors.get(_emb_key(t)) == embed_text(t.content):
            out[i].reused = True  # another agent's copy already has this vector
        else:
            later.append(i)
    return later


def _with_retry(fn: Callable[[], None], attempts: int = 3) -> None:
    """Retry an insert on a connection error; its deduplication token makes that safe."""
    for attempt in range(attempts):
        try:
            fn()
            return
        except OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * 4**attempt)


def _shared_keys(turns: list[conv_store.Turn], elsewhere: set[EmbKey]) -> set[EmbKey]:
    """The embedding keys of the user/assistant turns among `turns` that another agent's
    copy already landed for: the only ones whose embedding row can hold a vector."""
    return {_emb_key(t) for t in turns if t.role in EMBEDDED_ROLES} & elsewhere


def _screen(turns: list[conv_store.Turn]) -> None:
    """Mark the turns whose text reads as high (they are never sent to the model)."""
    for t in turns:
        t.high_sensitivity = reads_as_high(t.content)


def _emb_key(t: conv_store.Turn) -> EmbKey:
    return EmbKey(t.namespace, t.thread_id, t.msg_id)


def _embeddable(t: conv_store.Turn) -> bool:
    return t.role in EMBEDDED_ROLES and not t.high_sensitivity and bool(t.content.strip())


def _why_not_embedded(t: conv_store.Turn, high: bool) -> str:
    if t.role not in EMBEDDED_ROLES:
        return "role"
    if high:
        return "high_sensitivity"
    return "empty"


def _embed_turn(t: conv_store.Turn) -> EmbedTurn:
    return EmbedTurn(
        **picked(t, *TURN_KEY, *SPEAKER, "ts", "is_summary"),
        text=embed_text(t.content),
        speaker=speaker_of(t.metadata),
    )


_PIPELINE: Slot[AppendPipeline] = Slot("conversation.append")


def pipeline(svc: Services) -> AppendPipeline:
    """The process's append pipeline (made on first use, in the running event loop)."""
    return _PIPELINE.made(svc, lambda: AppendPipeline(svc))


async def close_pipeline(svc: Services) -> None:
    p = _PIPELINE.take(svc)
    if p is not None:
        await p.close()


async def append(
    svc: Services, who: Principal, namespace: str, agent: str, turns: Sequence[TurnIn]
) -> list[AppendResult]:
    """conversation.append (writer): store turns, one result per turn, in order."""
    who.require_role(Role.writer)
    ns = who.namespace(namespace)
    now = utcnow()
    rows = []
    for i, t in enumerate(turns):
        if t.role not in ROLES:
            raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", field="role")
        rows.append(
            conv_store.Turn(
                namespace=ns,
                agent=agent,
                thread_id=t.thread_id,
                msg_id=t.msg_id or derive_msg_id(t.thread_id, t.role, t.content),
                ts=now + timedelta(microseconds=i),  # a batch keeps its order
                role=t.role,
                content=t.content,
                reasoning=t.reasoning,
                user_id=t.user_id,
                run_id=t.run_id,
                metadata=dict(t.metadata),
                tokens=t.tokens,
                appended_by=who.token_id,
                version=next_version(),
            )
        )
    return await pipeline(svc).append(rows)


__all__ = ["AppendPipeline", "AppendResult", "append", "close_pipeline", "pipeline"]
