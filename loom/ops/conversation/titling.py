"""The conversation_titler: a periodic pass (an arq cron job on the worker pool,
every LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS) giving untitled threads a short
LLM-written title, which conversation.threads returns.

- It covers namespaces that record conversations (and whose model calls are switched
  on), threads active in the last LOOM_CONVERSATION_TITLER_WINDOW_HOURS with at least
  LOOM_CONVERSATION_TITLER_MIN_TURNS live turns, at most
  LOOM_CONVERSATION_TITLER_MAX_THREADS_PER_PASS per pass, the most recently active first.
- Off with LOOM_CONVERSATION_TITLER_ENABLED=false, and a pass does nothing with no
  model configured (the fake LLM). One pass at a time across worker processes: a
  Redis lease a pass that finds it taken leaves alone.
- A turn that reads as high is never sent to the model: the prompt carries the plain
  ones of the thread's first eight user and assistant turns. When all eight read as
  high, or the generated title does, the thread stays untitled and its metadata gets
  the ``title_refused`` mark, so no pass asks again; a thread with fewer than eight
  such turns waits, unmarked, for a plain one. conversation.update or create with new
  metadata replaces the mark, and the next pass asks once more.
- The title is written under the thread lease, only if the thread is still untitled
  and its metadata unchanged since it was read (a client's title or metadata wins).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from loom import failures, redis_keys
from loom import logging as loom_logging
from loom.clock import next_version, utcnow
from loom.leases import Lease, LeaseLost, thread_lease
from loom.ops.conversation.common import TITLE_REFUSED
from loom.providers.llm import ChatMessage, LLMError
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import threads as thread_store
from loom.store import titles as store

log = loom_logging.get("loom.conversation.titler")

LEASE_KEY = redis_keys.TITLER_LEASE
LEASE_TTL_MS = 30_000  # renewed at a third of it while the pass runs
FIRST_TURNS = 8  # the turns a title is written from (and the refusal counts)
TURN_CHARS = 1_000  # of each turn, in the prompt
TITLE_CHARS = 120
PROMPT = (Path(__file__).parent / "prompts" / "title_system.txt").read_text(encoding="utf-8")


@dataclass
class PassReport:
    ran: bool = False
    titled: int = 0
    refused: int = 0
    waiting: int = 0
    failed: int = 0


def _clean(title: str) -> str:
    title = " ".join(title.strip().strip("\"'").split())
    return title[:TITLE_CHARS].rstrip(" .")


async def _title_one(svc: Services, c: store.Candidate, report: PassReport) -> None:
    turns = await svc.run(store.first_turns, svc.ch, c, FIRST_TURNS)
    plain = [t for t in turns if not t.high]
    before = await svc.run(thread_store.get, svc.ch, c.namespace, c.agent, c.thread_id)
    if before is None:
        return
    title = ""
    if plain:
        text = "\n\n".join(f"[{t.role}] {t.content[:TURN_CHARS]}" for t in plain)
        try:
            async with asyncio.timeout(svc.settings.llm_timeout_seconds + 5.0):
                title = _clean(
                    await svc.llm.complete(
                        [ChatMessage("system", PROMPT), ChatMessage("user", text)],
                        max_tokens=32,
                        temperature=0.0,
                    )
                )
        except (LLMError, TimeoutError) as exc:
            log.warning("titler model call failed", error=failures.detail(exc))
            report.failed += 1
            return
        if not title:
            report.failed += 1
            return
    elif len(turns) < FIRST_TURNS:
        report.waiting += 1  # fewer than eight turns, all high: wait for a plain one
        return
    refuse = not title or reads_as_high(title)
    async with thread_lease(svc.redis, c.namespace, c.thread_id):
        now = await svc.run(thread_store.get, svc.ch, c.namespace, c.agent, c.thread_id)
        if now is None or now.tombstoned or now.title or now.metadata != before.metadata:
            return
        row = replace(now, updated_at=utcnow(), version=next_version())
        if refuse:
            row.metadata = {**now.metadata, TITLE_REFUSED: True}
        else:
            row.title = title
        await svc.run(thread_store.insert, svc.ch, [row])
    if refuse:
        report.refused += 1
    else:
        report.titled += 1


async def titler_pass(svc: Services, namespaces: Sequence[str] | None = None) -> PassReport:
    """One pass (the cron job's body); `namespaces` limits it to those (tests, a
    one-off by hand)."""
    cfg = svc.settings
    report = PassReport()
    if not cfg.conversation_titler_enabled or not svc.llm.configured:
        return report
    lease = Lease(svc.redis, LEASE_KEY, ttl_ms=LEASE_TTL_MS)
    if not await lease.try_acquire():
        return report
    renewer = asyncio.create_task(_keep_alive(lease))
    try:
        report.ran = True
        since = utcnow() - timedelta(hours=cfg.conversation_titler_window_hours)
        found = await svc.run(
            store.candidates,
            svc.ch,
            since,
            cfg.conversation_titler_min_turns,
            cfg.conversation_titler_max_threads_per_pass,
            TITLE_REFUSED,
            namespaces,
        )
        for c in found:
            await _title_one(svc, c, report)
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await renewer
        await lease.release()
    return report


async def _keep_alive(lease: Lease) -> None:
    while True:
        await asyncio.sleep(LEASE_TTL_MS / 3000)
        await lease.renew()


__all__ = ["LEASE_KEY", "PassReport", "titler_pass"]
