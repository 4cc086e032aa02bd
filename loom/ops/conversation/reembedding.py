"""conversation.reembed (admin) and `loom reembed`: rebuild a namespace's vectors.

A re-embed starts from exactly the text each embedding row keeps: a turn's first 2,048
characters, or the 240 an earlier build kept. It skips tombstoned rows and rows whose
text reads as high (an earlier build may have embedded one; its text never goes to the
model again). Each new vector is written under the thread lease after re-reading the
row: a row tombstoned or rewritten meanwhile is left alone. Rows whose embed had
failed are embedded again: an admin's re-embed is the one thing that retries them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loom import failures
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.ops.conversation.embedding import JobFailed, ModelFn, ReembedItem, reembed_items
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import embeddings as emb_store

log = loom_logging.get("loom.conversation.reembed")

PAGE = 256
IN_FLIGHT = 4

RunPage = Callable[[Sequence[ReembedItem]], Awaitable[dict[str, int]]]
Progress = Callable[[int], None]


@dataclass
class ReembedReport:
    namespace: str
    scanned: int = 0
    reembedded: int = 0
    skipped_tombstoned: int = 0
    skipped_high: int = 0
    skipped_changed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, counts: dict[str, int]) -> None:
        for k, v in counts.items():
            setattr(self, k, getattr(self, k) + v)


async def reembed_namespace(svc: Services, namespace: str, run_page: RunPage, *, thread_id: str | None = None,
                            page_size: int = PAGE, progress: Progress | None = None) -> ReembedReport:
    """Walk the namespace's embedding rows in key order, `IN_FLIGHT` pages at a time."""
    report = ReembedReport(namespace)
    slots = asyncio.Semaphore(IN_FLIGHT)
    tasks: list[asyncio.Task[None]] = []

    async def run(items: list[ReembedItem], scanned: int) -> None:
        try:
            if items:
                try:
                    report.add(await run_page(items))
                except Exception as exc:   # the report carries a code; the detail goes to the log
                    report.failed += len(items)
                    report.errors.append(str(exc) if isinstance(exc, JobFailed) else failures.failure(exc))
                    log.warning("re-embed page failed", namespace=namespace, error=failures.detail(exc))
            if progress is not None:
                progress(scanned)
        finally:
            slots.release()

    after: tuple[str, str] | None = None
    while True:
        page = await svc.run(emb_store.scan, svc.ch, namespace, after=after, limit=page_size, thread_id=thread_id)
        if not page:
            break
        after = (page[-1].thread_id, page[-1].msg_id)
        items: list[ReembedItem] = []
        for row in page:
            report.scanned += 1
            if row.tombstoned:
                report.skipped_tombstoned += 1
            elif reads_as_high(row.text):
                report.skipped_high += 1
            else:
                items.append(ReembedItem(row.namespace, row.thread_id, row.msg_id, row.text))
        await slots.acquire()
        tasks.append(asyncio.get_running_loop().create_task(run(items, len(page))))
        if len(page) < page_size:
            break
    if tasks:
        await asyncio.gather(*tasks)
    return report


async def reembed(svc: Services, who: Principal, namespace: str, *, thread_id: str | None = None) -> ReembedReport:
    """conversation.reembed (admin): re-embed through the worker pool."""
    from loom.ops.conversation.appending import pipeline

    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    client = pipeline(svc).embedder
    timeout = max(120.0, svc.settings.embed_wait_seconds * 8)
    return await reembed_namespace(svc, ns, lambda items: client.reembed(items, timeout), thread_id=thread_id)


async def reembed_with(svc: Services, namespace: str, model: ModelFn, *, thread_id: str | None = None,
                       progress: Progress | None = None, page_size: int = PAGE) -> ReembedReport:
    """Re-embed in this process with `model` (the `loom reembed` CLI: no worker needed)."""
    return await reembed_namespace(svc, namespace, lambda items: reembed_items(svc, model, items),
                                   thread_id=thread_id, page_size=page_size, progress=progress)
