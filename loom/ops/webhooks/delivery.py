"""One delivery attempt (the `webhook_deliver` job on the worker pool).

The webhook and the namespace's secret are read when the attempt runs (a deleted
webhook's queued attempts are dropped, `webhook_gone`; a rotated secret signs from then
on). The body is POSTed as it was built, with ``Loom-Signature: t=<unix>,v1=<hex>``
(loom.sdk.webhooks.sign over "<t>.<body>", t being this attempt's time), never following
a redirect, within LOOM_WEBHOOK_TIMEOUT_SECONDS. A 2xx answer is `delivered`; anything
else (a 3xx included: `redirect`) is a failure: while fewer than LOOM_WEBHOOK_MAX_ATTEMPTS
attempts were made, the next is enqueued after LOOM_WEBHOOK_BACKOFF_SECONDS x 2^(n-1) (at most
6 hours)
(`retrying`), else the delivery ends (`gave_up`). Every attempt is a row of
loom.webhook_deliveries with a stable error code, never the receiver's answer or an
exception's text. A worker killed mid-attempt leaves the job to arq, which runs it again
(a receiver may see an event twice: the event's `id` tells).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

import httpx

from loom import failures, jobs
from loom import logging as loom_logging
from loom.clock import utcnow
from loom.ops.webhooks import events
from loom.sdk.webhooks import HEADER, signature_header
from loom.services import Services
from loom.store import webhooks as store
from loom.store.webhooks import Delivery

log = loom_logging.get("loom.webhooks")

DELIVERED, RETRYING, GAVE_UP, DROPPED = "delivered", "retrying", "gave_up", "dropped"
# error codes (stable: the delivery log's `error`)
HTTP_STATUS, REDIRECT, TIMEOUT, CONNECT_FAILED = "http_status", "redirect", "timeout", "connect_failed"
WEBHOOK_GONE, NO_SECRET, INTERNAL_ERROR = "webhook_gone", "no_secret", "internal_error"
USER_AGENT = "Loom-Webhooks/1"


@dataclass
class Attempt:
    status_code: int = 0
    error: str = ""


MAX_BACKOFF_S = 6 * 3600.0


def backoff_s(base_s: float, attempt: int) -> float:
    """The wait after failed attempt `attempt` (1-based) before the next: doubled each
    time, at most MAX_BACKOFF_S."""
    return float(min(base_s * 2 ** (attempt - 1), MAX_BACKOFF_S))


async def _post(url: str, text: str, secret: str, job: jobs.WebhookDeliverJob, timeout_s: float) -> Attempt:
    raw = text.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        HEADER: signature_header(secret, raw),
        "Loom-Event": job.event,
        "Loom-Event-Id": job.event_id,
        "Loom-Webhook-Id": job.webhook_id,
        "Loom-Attempt": str(job.attempt),
    }
    try:
        async with httpx.AsyncClient(follow_redirects=False, timeout=timeout_s, trust_env=False) as client:
            answer = await client.post(url, content=raw, headers=headers)
    except httpx.TimeoutException:
        return Attempt(error=TIMEOUT)
    except (httpx.TransportError, OSError):
        return Attempt(error=CONNECT_FAILED)
    if 200 <= answer.status_code < 300:
        return Attempt(answer.status_code)
    return Attempt(answer.status_code, REDIRECT if 300 <= answer.status_code < 400 else HTTP_STATUS)


_JOB_FIELDS = {f.name for f in fields(Delivery)} & set(jobs.WebhookDeliverJob.model_fields)


async def deliver(svc: Services, payload: dict[str, Any]) -> dict[str, Any]:
    job = jobs.read(jobs.WebhookDeliverJob, payload)
    cfg = svc.settings
    started = time.monotonic()
    hook = await svc.run(store.get, svc.ch, job.namespace, job.webhook_id)
    secret = await svc.run(store.secret, svc.ch, job.namespace) if hook is not None else None
    if hook is None:
        got = Attempt(error=WEBHOOK_GONE)
    elif secret is None:
        got = Attempt(error=NO_SECRET)
    else:
        try:
            got = await _post(hook.url, job.body, secret, job, cfg.webhook_timeout_seconds)
        except Exception as exc:  # never the worker's problem: logged, recorded, retried
            log.warning("webhook delivery failed", webhook_id=job.webhook_id, error=failures.detail(exc))
            got = Attempt(error=INTERNAL_ERROR)
    now = utcnow()
    next_at = None
    if not got.error:
        outcome = DELIVERED
    elif hook is None or secret is None:
        outcome = DROPPED
    elif job.attempt < cfg.webhook_max_attempts:
        wait = backoff_s(cfg.webhook_backoff_seconds, job.attempt)
        next_at = now + timedelta(seconds=wait)
        outcome = RETRYING
        await events.enqueue(svc, job.model_copy(update={"attempt": job.attempt + 1}), defer_s=wait)
    else:
        outcome = GAVE_UP
    # The delivery row repeats the job's fields (its body aside) by name.
    row = Delivery(
        **job.model_dump(include=_JOB_FIELDS),
        status_code=got.status_code,
        error=got.error,
        outcome=outcome,
        attempted_at=now,
        duration_ms=int((time.monotonic() - started) * 1000),
        next_attempt_at=next_at,
    )
    await svc.run(store.record, svc.ch, [row])
    return {"outcome": outcome, "attempt": job.attempt, "status_code": got.status_code, "error": got.error}
