"""conversation.reembed (admin) and `loom reembed`: rebuild a namespace's vectors.

A re-embed starts from exactly the text each embedding row keeps: a turn's first 2,048
characters, or the 240 an earlier build kept. It skips tombstoned rows, and never sends
the model a turn that reads as high: neither a row whose kept text reads as high nor
one whose transcript row does (marked high, or its whole content reads as high), even
where the kept characters look clean and the high part lies beyond them (an earlier
build screened less and may have embedded such a turn). Such an embedding row is
tombstoned (counted in skipped_high): its vector and kept text go, and a newer version
keeps older ones from coming back. Each new vector is written under the thread lease
after re-reading the row: a row tombstoned or rewritten meanwhile is left alone. Rows whose embed had
failed are embedded again: an admin's re-embed is the one thing that retries them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from loom import failures
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import next_version
from loom.jobs import ReembedItem
from loom.leases import under_thread_leases
from loom.ops.conversation.writing.appending import pipeline
from loom.ops.embedding.writer import ModelFn, model_texts, reembed_items
from loom.providers.embedders import Embedder
from loom.replies import JobFailed
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import search_marks, vector_models
from loom.store.conversations import RECORDED
from loom.store.keys import EmbKey
from loom.store.search import VECTOR_TABLES

log = loom_logging.get("loom.conversation.reembed")

PAGE = 256
IN_FLIGHT = 4

RunPage = Callable[[Sequence[ReembedItem]], Awaitable[dict[str, int]]]
Progress = Callable[[int], None]


@dataclass(kw_only=True)
class ReembedReport:
    namespace: str
    scanned: int = 0
    reembedded: int = 0
    skipped_tombstoned: int = 0
    skipped_high: int = 0
    skipped_changed: int = 0
    skipped_current: int = 0  # `--model`: the row's vector of that model is already built from its text
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, counts: dict[str, int]) -> None:
        for k, v in counts.items():
            setattr(self, k, getattr(self, k) + v)


@dataclass(frozen=True)
class Walk:
    """The embedding rows a re-embed walks: a namespace's (or one thread's), in key order
    and pages of `page_size`; `progress` hears how many rows each page scanned."""

    namespace: str
    thread_id: str | None = None
    page_size: int = PAGE
    progress: Progress | None = None


async def reembed_namespace(svc: Services, walk: Walk, run_page: RunPage) -> ReembedReport:
    """Walk the embedding rows, `IN_FLIGHT` pages at a time."""
    report = ReembedReport(namespace=walk.namespace)
    slots = asyncio.Semaphore(IN_FLIGHT)
    tasks: list[asyncio.Task[None]] = []

    async def run(items: list[ReembedItem], scanned: int) -> None:
        try:
            if items:
                try:
                    report.add(await run_page(items))
                except Exception as exc:  # the report carries a code; the detail goes to the log
                    report.failed += len(items)
                    report.errors.append(str(exc) if isinstance(exc, JobFailed) else failures.failure(exc))
                    log.warning("re-embed page failed", namespace=walk.namespace, error=failures.detail(exc))
            if walk.progress is not None:
                walk.progress(scanned)
        finally:
            slots.release()

    after: tuple[str, str] | None = None
    while True:
        page = await svc.run(
            emb_store.scan,
            svc.ch,
            walk.namespace,
            after=after,
            limit=walk.page_size,
            thread_id=walk.thread_id,
        )
        if not page:
            break
        after = (page[-1].thread_id, page[-1].msg_id)
        items: list[ReembedItem] = []
        live = [row for row in page if not row.tombstoned]
        report.scanned += len(page)
        report.skipped_tombstoned += len(page) - len(live)
        high = await svc.run(_reading_high, svc, live)
        for row in live:
            if row.key not in high:
                items.append(
                    ReembedItem(
                        namespace=row.namespace, thread_id=row.thread_id, msg_id=row.msg_id, text=row.text
                    )
                )
        if high:
            report.skipped_high += len(high)
            await tombstone_rows(svc, [row for row in live if row.key in high])
        await slots.acquire()
        tasks.append(asyncio.get_running_loop().create_task(run(items, len(page))))
        if len(page) < walk.page_size:
            break
    if tasks:
        await asyncio.gather(*tasks)
    return report


def _reading_high(svc: Services, rows: Sequence[emb_store.ReembedCandidate]) -> set[EmbKey]:
    """The rows whose kept text, or any transcript copy of whose turn, reads as high."""
    high = {row.key for row in rows if reads_as_high(row.text)}
    copies = conv_store.copy_texts(svc.ch, [row.key for row in rows if row.key not in high])
    for key, texts in copies.items():
        if any(marked or reads_as_high(content) for content, marked in texts):
            high.add(key)
    return high


async def tombstone_rows(svc: Services, rows: Sequence[emb_store.ReembedCandidate]) -> None:
    """Tombstone the embedding rows of turns that read as high, under the thread leases;
    a row rewritten since it was scanned (another version) is left to the next pass."""
    by_pair: dict[tuple[str, str], list[emb_store.ReembedCandidate]] = {}
    for row in rows:
        by_pair.setdefault((row.namespace, row.thread_id), []).append(row)

    def write(batch: list[emb_store.ReembedCandidate]) -> None:
        current = emb_store.rows(svc.ch, [r.key for r in batch])
        scanned = {r.key: r.version for r in batch}
        dead = [
            replace(now, text="", embedding=[], model="", error="", tombstoned=True, version=next_version())
            for key, now in current.items()
            if now.version == scanned[key] and not now.tombstoned
        ]
        if dead:
            emb_store.insert(svc.ch, dead)

    async def work(held: set[tuple[str, str]]) -> None:
        await svc.run(write, [r for p in held for r in by_pair[p]])

    # Rewrites existing rows: search must verify the vectors it still holds of them.
    async with search_marks.changing(svc.redis, svc.ch, svc.run, sorted(by_pair)):
        await under_thread_leases(svc.redis, by_pair, work)


async def reembed(
    svc: Services, who: Principal, namespace: str, *, thread_id: str | None = None
) -> ReembedReport:
    """conversation.reembed (admin): re-embed through the worker pool."""
    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    client = pipeline(svc).embedder
    timeout = max(120.0, svc.settings.embed_wait_seconds * 8)
    return await reembed_namespace(svc, Walk(ns, thread_id), lambda items: client.reembed(items, timeout))


async def reembed_with(svc: Services, walk: Walk, model: ModelFn) -> ReembedReport:
    """Re-embed in this process with `model` (the `loom reembed` CLI: no worker needed)."""
    return await reembed_namespace(svc, walk, lambda items: reembed_items(svc, model, items))


async def reembed_to_model(svc: Services, walk: Walk, embedder: Embedder) -> ReembedReport:
    """`loom reembed --model`: build the namespace's vectors of `embedder`'s model beside
    the ones search uses now (loom.store.vector_models), in this process, while the
    service keeps answering from the model it has. Rows whose vector of that model is
    already built from their current version are skipped, so a second run catches up
    with the turns appended or changed since the first (run it again right after
    switching LOOM_EMBEDDER)."""
    if embedder.dim not in VECTOR_TABLES:
        raise ValueError(
            f"no vector table holds {embedder.dim}-dimension vectors (indexed: {sorted(VECTOR_TABLES)})"
        )
    loop = asyncio.get_running_loop()

    async def run_page(items: Sequence[ReembedItem]) -> dict[str, int]:
        rows = await svc.run(emb_store.rows, svc.ch, [it.key for it in items])
        built = await svc.run(
            vector_models.staged_versions, svc.ch, embedder.dim, embedder.model_id, list(rows)
        )
        counts = {"reembedded": 0, "skipped_changed": 0, "skipped_current": 0}
        todo: list[tuple[ReembedItem, emb_store.EmbeddingRow]] = []
        for it in items:
            row = rows.get(it.key)
            if row is None or row.text != it.text or row.tombstoned or row.error or row.origin != RECORDED:
                counts["skipped_changed"] += 1  # rewritten since the scan, or not a searched vector
            elif row.model == embedder.model_id or built.get(it.key) == row.version:
                counts["skipped_current"] += 1
            else:
                todo.append((it, row))
        if todo:
            texts = await model_texts(svc, [it for it, _ in todo])
            vectors = await loop.run_in_executor(None, embedder.embed, texts)
            pairs = [(row, vectors[j]) for j, (_, row) in enumerate(todo)]
            counts["reembedded"] = await svc.run(vector_models.write, svc.ch, embedder.model_id, pairs)
        return counts

    return await reembed_namespace(svc, walk, run_page)
