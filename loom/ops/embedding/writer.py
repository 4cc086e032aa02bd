"""The worker's side of embedding: the model call, then the embedding rows written
under the thread leases. An arq job (workers/embed_jobs.py) runs it for an append's
turns and for a re-embed; the recovery pass (:mod:`loom.ops.embedding.recovery`)
writes through :func:`write_recovered`; the API's fail-open write
(:mod:`loom.ops.embedding.client`) shares :func:`write_under_leases`.

:class:`EmbedPipeline` (one per worker process) hands the texts to the model
micro-batcher (which merges concurrent jobs' texts into model calls), and writes the
vectors in batches, under the thread leases, taken only after the model call. Under the
lease it re-reads the transcript rows: a turn tombstoned meanwhile gets no late vector
("deleted"); a turn saved meanwhile passes its is_saved/saved_at and owner (a save
claims an unowned row) to its embedding row; a live vector another agent's copy wrote
meanwhile is never overwritten by an error. Nothing is written for a gated job before
the API said its rows are durable (the insert gate), nothing at all if they are not.

The recovery pass embeds turns that landed with no embedding row at all once they are
older than its grace. So that it and a late job never both write one turn, a job's
vectors are written only while the job is younger than that grace less
RECOVERY_CLOCK_MARGIN_S (checked under the thread lease, which the pass holds too);
past it, the job's turns are left to the pass (or to the error row the API wrote when
its own wait ran out).

Version ordering: the worker stamps its rows with the clock when it writes. The API's
timeout row carries the version stamped when the job was enqueued, which is older than
anything the worker can write for that job, so a vector that lands after the API gave
up always wins over the API's error row, whichever insert reaches ClickHouse first.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from loom import failures
from loom import logging as loom_logging
from loom.clock import next_version
from loom.jobs import EmbedTurn, ReembedItem
from loom.leases import under_thread_leases
from loom.ops.conversation.common import (
    DELETED,
    EMBEDDED,
    FAILED,
    KEPT,
    TURN_KEY,
    model_text,
    picked,
    skipped,
)
from loom.providers.embedders.batcher import ModelResult
from loom.services import Services
from loom.settings import Settings
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import search_marks
from loom.store.keys import EmbKey, TurnKey
from loom.store.write_buffer import Batcher

log = loom_logging.get("loom.conversation.embedding")

RECOVERY_CLOCK_MARGIN_S = 5.0  # clock skew between API, worker and store hosts, with room to spare


@dataclass(frozen=True)
class Outcome:
    status: str  # "embedded" | "skipped:deleted" | "failed"
    error: str = ""


ModelFn = Callable[[list[str]], Awaitable[ModelResult]]
PartFn = Callable[[int, list["Outcome"]], Awaitable[None]]  # (index of the part's first turn, outcomes)


def model_from_embedder(get_embedder: Callable[[], Any], executor: Executor | None = None) -> ModelFn:
    """A model function calling an embedder directly (no batching across callers):
    for the `loom reembed` CLI, which embeds in its own process."""

    async def run(texts: list[str]) -> ModelResult:
        embedder = get_embedder()
        try:
            vectors = await asyncio.get_running_loop().run_in_executor(executor, embedder.embed, texts)
        except Exception as exc:
            log.warning("embedding call failed", error=failures.detail(exc, sent=texts), texts=len(texts))
            msg = failures.embed_failure(exc)
            return ModelResult([None] * len(texts), [msg] * len(texts), embedder.model_id)
        return ModelResult(list(vectors), [""] * len(texts), embedder.model_id)

    return run


# -- the append job's writer ------------------------------------------------------


def embedding_row(
    t: EmbedTurn,
    st: conv_store.TurnState,
    *,
    vector: Any,  # a numpy vector or a list; None for none
    model: str,
    error: str,
    version: int,
) -> emb_store.EmbeddingRow:
    """The embedding row of turn `t` as its transcript row stands now (`st`: its owner,
    saved flag and origin, which a save may have changed since the job was enqueued): a
    vector, or an empty one with its (safe) error."""
    return emb_store.EmbeddingRow(
        **picked(t, *TURN_KEY, "agent", "role", "run_id", "ts", "text", "is_summary"),
        **picked(st, "user_id", *KEPT),
        embedding=vector if vector is not None else [],
        model=model,
        error=error,
        tombstoned=False,
        version=version,
    )


@dataclass
class _Write:
    turn: EmbedTurn
    vector: np.ndarray | None = None
    model: str = ""
    error: str = ""
    not_after_ns: int = 0  # written only up to this wall-clock time (0: no limit)


def write_deadline_ns(settings: Settings, enqueued_ns: int) -> int:
    """Until when the vectors of a job enqueued at `enqueued_ns` may be written: past
    it, the recovery pass may have embedded its turns."""
    return enqueued_ns + int((settings.recovery_grace_seconds - RECOVERY_CLOCK_MARGIN_S) * 1e9)


@dataclass
class _Reembed:
    item: ReembedItem
    vector: np.ndarray | None
    model: str
    error: str


class EmbedPipeline:
    """Per worker process: model call, then vector write, each batched across the
    concurrent jobs of the process."""

    def __init__(self, svc: Services, model: ModelFn) -> None:
        self.svc = svc
        self.model = model
        self._writes: Batcher[_Write, Outcome] = Batcher(
            self._write_flush, max_items=5_000, max_wait_s=0.001, max_inflight=4, name="embed-write"
        )

    async def close(self) -> None:
        await self._writes.close()

    async def embed_turns(
        self,
        turns: Sequence[EmbedTurn],
        *,
        chunk: int = 256,
        on_part: PartFn | None = None,
        gate: Awaitable[bool] | None = None,
        not_after_ns: int = 0,
    ) -> list[Outcome]:
        """Embed and write `turns` in chunks of `chunk`, all queued at once: each chunk
        is written (and reported through `on_part`) as soon as its own model call is
        done, so the first turns of a job are answered while the rest still compute.
        With a `gate`, nothing is written before it says the turns' rows are durable,
        and nothing at all if it says they are not (their outcome: deleted). Nothing is
        written past `not_after_ns` (:func:`write_deadline_ns`; 0: no limit)."""
        gated = asyncio.ensure_future(gate) if gate is not None else None

        async def one(lo: int) -> list[Outcome]:
            part = turns[lo : lo + chunk]
            prefix = self.svc.settings.embed_speaker_prefix
            result = await self.model(
                [model_text(t.text, t.role, t.is_summary, prefix, t.speaker) for t in part]
            )
            if gated is not None and not await asyncio.shield(gated):
                outcomes = [Outcome(skipped(DELETED))] * len(part)
                if on_part is not None:
                    await on_part(lo, outcomes)
                return outcomes
            outcomes = await self._writes.submit_many(
                [
                    _Write(t, result.vectors[j], result.model_id, result.errors[j], not_after_ns)
                    for j, t in enumerate(part)
                ]
            )
            if on_part is not None:
                await on_part(lo, outcomes)
            return outcomes

        try:
            parts = await asyncio.gather(*(one(lo) for lo in range(0, len(turns), chunk)))
        finally:
            if gated is not None and not gated.done():
                gated.cancel()  # a failed job leaves no reader blocked on Redis
        return [o for part in parts for o in part]

    async def _write_flush(self, items: list[_Write]) -> list[Outcome]:
        results: dict[int, Outcome] = {}
        by_pair: dict[tuple[str, str], list[int]] = {}
        for i, w in enumerate(items):
            by_pair.setdefault((w.turn.namespace, w.turn.thread_id), []).append(i)

        async def work(held: set[tuple[str, str]]) -> None:
            idxs = [i for p in held for i in by_pair[p]]
            results.update(await self.svc.run(self._write_sync, [(i, items[i]) for i in idxs]))

        await under_thread_leases(self.svc.redis, by_pair, work)
        return [results[i] for i in range(len(items))]

    def _write_sync(self, batch: list[tuple[int, _Write]]) -> dict[int, Outcome]:
        """Under the leases: re-read the transcript rows, then one insert."""
        ch = self.svc.ch
        turns = conv_store.states(ch, [w.turn.turn_key for _, w in batch])
        failing = [w.turn.emb_key for _, w in batch if w.error]
        current = emb_store.states(ch, failing) if failing else {}
        rows: dict[EmbKey, emb_store.EmbeddingRow] = {}
        out: dict[int, Outcome] = {}
        now = time.time_ns()
        for i, w in batch:
            t = w.turn
            st = turns.get(t.turn_key)
            if st is None or st.tombstoned:
                out[i] = Outcome(skipped(DELETED))  # removed while its embedding ran: no late vector
                continue
            if w.not_after_ns and now > w.not_after_ns:
                # Too late: the recovery pass may have embedded the turn (under this lease).
                out[i] = Outcome(FAILED, failures.text(failures.EMBEDDER_TIMEOUT))
                continue
            if w.error:
                cur = current.get(t.emb_key)
                if cur is not None and cur.has_vector and not cur.tombstoned:
                    # A live vector is already there (another agent's copy): never clobber it.
                    out[i] = (
                        Outcome(EMBEDDED) if cur.text == t.text else Outcome(FAILED, failures.safe(w.error))
                    )
                    continue
                out[i] = Outcome(FAILED, failures.safe(w.error))
            else:
                out[i] = Outcome(EMBEDDED)
            ok = w.vector is not None and not w.error
            rows[t.emb_key] = embedding_row(
                t,
                st,
                vector=w.vector if ok else None,
                model=w.model,
                error=failures.safe(w.error) if w.error else "",
                version=next_version(),
            )
        if rows:
            emb_store.insert(ch, list(rows.values()), dedup_token=uuid.uuid4().hex)
        return out

    # -- re-embedding --------------------------------------------------------

    async def reembed(self, items: Sequence[ReembedItem]) -> dict[str, int]:
        return await reembed_items(self.svc, self.model, items)


def _who(found: tuple[str, bool, str] | None) -> tuple[str, bool, bool, str]:
    """model_text's arguments after the text, for a re-embedded row (prefix on)."""
    role, is_summary, speaker = found or ("", False, "")
    return role, is_summary, True, speaker


async def model_texts(svc: Services, items: Sequence[ReembedItem]) -> list[str]:
    """What the model reads of each item's kept text (behind its speaker with
    LOOM_EMBED_SPEAKER_PREFIX on)."""
    texts = [it.text for it in items]
    if svc.settings.embed_speaker_prefix:
        who = await svc.run(emb_store.speakers, svc.ch, [it.key for it in items])
        texts = [model_text(it.text, *_who(who.get(it.key))) for it in items]
    return texts


async def reembed_items(svc: Services, model: ModelFn, items: Sequence[ReembedItem]) -> dict[str, int]:
    """Embed each item's kept text and write the vectors (see write_reembedded)."""
    result = await model(await model_texts(svc, items))
    done = [_Reembed(it, result.vectors[j], result.model_id, result.errors[j]) for j, it in enumerate(items)]
    return await write_reembedded(svc, done)


async def write_reembedded(svc: Services, done: Sequence[_Reembed]) -> dict[str, int]:
    """Write re-embedded vectors under the thread leases, re-checking each row first: a
    row tombstoned or rewritten (another text) meanwhile is left as it is."""
    counts = {"reembedded": 0, "skipped_tombstoned": 0, "skipped_changed": 0, "failed": 0}
    by_pair: dict[tuple[str, str], list[_Reembed]] = {}
    for d in done:
        by_pair.setdefault((d.item.namespace, d.item.thread_id), []).append(d)

    def write(batch: list[_Reembed]) -> dict[str, int]:
        current = emb_store.rows(svc.ch, [d.item.key for d in batch])
        local = dict.fromkeys(counts, 0)
        rows = []
        for d in batch:
            row = current.get(d.item.key)
            if row is None or row.tombstoned:
                local["skipped_tombstoned"] += 1
            elif row.text != d.item.text:
                local["skipped_changed"] += 1
            elif d.error or d.vector is None:
                local["failed"] += 1
            else:
                rows.append(replace(row, embedding=d.vector, model=d.model, error="", version=next_version()))
                local["reembedded"] += 1
        if rows:
            emb_store.insert(svc.ch, rows, dedup_token=uuid.uuid4().hex)
        return local

    async def work(held: set[tuple[str, str]]) -> None:
        local = await svc.run(write, [d for p in held for d in by_pair[p]])
        for k, v in local.items():
            counts[k] += v

    # New versions of existing rows: search must verify the old vectors it still holds.
    async with search_marks.changing(svc.redis, svc.ch, svc.run, sorted(by_pair)):
        await under_thread_leases(svc.redis, by_pair, work)
    return counts


# -- shared with the API's fail-open write and the recovery pass ------------------


async def write_under_leases(
    svc: Services, turns: Sequence[EmbedTurn], write: Callable[[list[int]], dict[int, Outcome]]
) -> list[Outcome]:
    """Run `write` (blocking, on the store's thread pool) for the indexes of `turns`
    whose threads' leases are held, thread by thread, and answer one outcome per turn."""
    out: dict[int, Outcome] = {}
    by_pair: dict[tuple[str, str], list[int]] = {}
    for i, t in enumerate(turns):
        by_pair.setdefault((t.namespace, t.thread_id), []).append(i)

    async def work(held: set[tuple[str, str]]) -> None:
        out.update(await svc.run(write, [i for p in held for i in by_pair[p]]))

    await under_thread_leases(svc.redis, by_pair, work)
    return [out[i] for i in range(len(turns))]


PRESENT = "present"  # the recovery pass found an embedding row in place: nothing written


def states_of(
    ch: Client, turns: Sequence[EmbedTurn]
) -> tuple[dict[TurnKey, conv_store.TurnState], dict[EmbKey, emb_store.EmbeddingState]]:
    """What a write under the thread leases checks first: each turn's transcript row
    and its embedding row, as they are now."""
    return conv_store.states(ch, [t.turn_key for t in turns]), emb_store.states(
        ch, [t.emb_key for t in turns]
    )


@dataclass(frozen=True, kw_only=True)
class LiveTurn:
    """A turn found live under its thread lease, as a batch write decides on it."""

    index: int  # in the turns written
    turn: EmbedTurn
    state: conv_store.TurnState  # its transcript row now
    current: emb_store.EmbeddingState | None  # its embedding row now (None: none)
    pending: bool  # this batch already writes a row for its key


Decide = Callable[[LiveTurn], tuple[Outcome, emb_store.EmbeddingRow | None]]  # its outcome and row


async def write_live(
    svc: Services, turns: Sequence[EmbedTurn], decide: Decide, dedup: Callable[[list[int]], str]
) -> list[Outcome]:
    """Under the thread leases: skip each turn deleted meanwhile, let `decide` answer the
    others' outcomes and rows, insert the rows (deduplicated by `dedup` of the batch)."""

    def write(idxs: list[int]) -> dict[int, Outcome]:
        batch = [turns[i] for i in idxs]
        live, current = states_of(svc.ch, batch)
        rows: dict[EmbKey, emb_store.EmbeddingRow] = {}
        local: dict[int, Outcome] = {}
        for i, t in zip(idxs, batch, strict=True):
            st = live.get(t.turn_key)
            if st is None or st.tombstoned:
                local[i] = Outcome(skipped(DELETED))
                continue
            live_turn = LiveTurn(
                index=i, turn=t, state=st, current=current.get(t.emb_key), pending=t.emb_key in rows
            )
            local[i], row = decide(live_turn)
            if row is not None:
                rows[t.emb_key] = row
        if rows:
            emb_store.insert(svc.ch, list(rows.values()), dedup_token=dedup(idxs))
        return local

    return await write_under_leases(svc, turns, write)


async def write_recovered(svc: Services, turns: Sequence[EmbedTurn], result: ModelResult) -> list[Outcome]:
    """The recovery pass's write (loom.ops.embedding.recovery), after its model call:
    under the thread leases, for each turn still live that has no embedding row at all,
    a row with its vector, or with its error (fail-open, as an append's embed). A row
    that landed meanwhile (a late append job, a save, another pass) is kept as it is:
    the pass never writes over an embedding row, so it needs no search marks."""

    def decide(lt: LiveTurn) -> tuple[Outcome, emb_store.EmbeddingRow | None]:
        if lt.current is not None or lt.pending:
            return Outcome(skipped(PRESENT)), None
        vector, error = result.vectors[lt.index], result.errors[lt.index]
        if error or vector is None:
            outcome, vector = Outcome(FAILED, failures.safe(error)), None
        else:
            outcome = Outcome(EMBEDDED)
        model = result.model_id if vector is not None else ""
        row = embedding_row(
            lt.turn, lt.state, vector=vector, model=model, error=outcome.error, version=next_version()
        )
        return outcome, row

    return await write_live(svc, turns, decide, lambda _: f"recovered-{uuid.uuid4().hex}")
