"""Emitting an event: one `webhook_deliver` job per webhook of the namespace that takes it.

An event's body is JSON: ``{"id", "type", "created_at", "namespace", "data"}``, where
`data` holds ids and counts only (never a turn's, fact's or evidence's text, nor a
title), so the queue, the receiver and any log in between learn nothing said. Emitting
never fails the op that emits: a failure to read the registrations or to enqueue is
logged and the event is lost (webhooks are a notification, not the record: the job
status, the erasure's receipt and the compaction's answer are).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from loom import failures, jobs
from loom import logging as loom_logging
from loom.clock import utcnow
from loom.queue import QUEUE, wake_workers
from loom.services import Services
from loom.store import webhooks as store

log = loom_logging.get("loom.webhooks")
JOB = jobs.WEBHOOK_DELIVER


def body(event_id: str, event: str, namespace: str, created_at: str, data: dict[str, Any]) -> str:
    return json.dumps(
        {"id": event_id, "type": event, "created_at": created_at, "namespace": namespace, "data": data},
        separators=(",", ":"),
        sort_keys=True,
    )


async def emit(svc: Services, namespace: str, event: str, data: dict[str, Any]) -> str | None:
    """Queue `event` for every webhook of `namespace` that takes it; the event's id, or
    None when none does (or emitting failed, which is logged)."""
    try:
        hooks = [h for h in await svc.run(store.live, svc.ch, namespace) if event in h.events]
        if not hooks:
            return None
        now = utcnow()
        event_id = "evt_" + uuid.uuid4().hex
        text = body(event_id, event, namespace, now.isoformat(), data)
        for hook in hooks:
            job = jobs.WebhookDeliverJob.model_construct(
                v=jobs.WebhookDeliverJob.VERSION,
                namespace=namespace,
                webhook_id=hook.webhook_id,
                event=event,
                event_id=event_id,
                event_at=now,
                body=text,
                attempt=1,
            )
            await enqueue(svc, job)
        await wake_workers(svc.redis)
        return event_id
    except Exception as exc:  # a notification must not fail the op that emits it
        log.warning("webhook event not queued", event_type=event, error=failures.detail(exc))
        return None


async def enqueue(svc: Services, job: jobs.WebhookDeliverJob, *, defer_s: float | None = None) -> None:
    await svc.arq.enqueue_job(
        JOB,
        job.model_dump(),
        _job_id=f"wh-{job.event_id}-{job.webhook_id}-{job.attempt}",  # a retry enqueued twice runs once
        _queue_name=QUEUE,
        _defer_by=defer_s,
    )
