"""What webhooks cost the ops that emit them, and how soon a receiver hears.

    .venv/bin/python -m bench.webhook_bench [--rounds N]

On a private embedded endpoint and Redis, with an in-process arq worker (the production
build_worker) and a local receiver (tests/webhooks/receiver.py):

* `emit` in a namespace with no webhook: the one read of its registrations an op pays
  after an extraction, a compaction or an erasure's removal;
* `emit` in a namespace with one webhook taking the event: that read, the body, the
  enqueue and the workers' wake-up;
* end to end: from emit's start to the receiver holding the signed POST (the worker's
  pick-up, its reads of the webhook and the secret, the POST), and to the delivery's row
  in the log.

Prints the median and p95 of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from bench.private_stack import private_services
from loom.auth.principal import Principal, Role
from loom.ops.webhooks import events, registry
from loom.store import webhooks as store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.webhooks.receiver import Receiver  # noqa: E402


def _figures(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]
    return f"{name:<44} median {statistics.median(xs):7.2f} ms   p95 {p95:7.2f} ms   (n={len(xs)})"


async def run(rounds: int) -> list[str]:
    from workers.main import build_worker

    lines: list[str] = []
    async with private_services("loomwh-", "loom_webhook_bench") as svc:
        worker = build_worker(
            svc.settings,
            svc.settings.clickhouse_url,
            svc.settings.redis_url,
            handle_signals=False,
            burst=False,
            cron_jobs=[],
        )
        task = asyncio.create_task(worker.async_run())
        try:
            admin = Principal("bench", ("quiet", "hooked"), Role.admin)
            with Receiver() as rec:
                await registry.register(svc, admin, "hooked", rec.url, [registry.ERASURE_COMPLETED])
                data = {"erasure_id": "e", "kind": "user", "removed": {"memories": 1}, "removed_at": "now"}
                quiet, hooked, heard, logged = [], [], [], []
                for _ in range(rounds):
                    t0 = time.monotonic()
                    await events.emit(svc, "quiet", registry.ERASURE_COMPLETED, data)
                    quiet.append((time.monotonic() - t0) * 1000)
                for _ in range(rounds):
                    before = len(rec.received)
                    t0 = time.monotonic()
                    event_id = await events.emit(svc, "hooked", registry.ERASURE_COMPLETED, data)
                    hooked.append((time.monotonic() - t0) * 1000)
                    while len(rec.received) == before:
                        await asyncio.sleep(0.001)
                    heard.append((rec.received[-1].at - t0) * 1000)
                    while not await svc.run(
                        store.deliveries, svc.ch, "hooked", webhook_id=None, event_id=event_id, limit=1
                    ):
                        await asyncio.sleep(0.002)
                    logged.append((time.monotonic() - t0) * 1000)
                lines += [
                    _figures("emit, no webhook (one read)", quiet),
                    _figures("emit, one webhook (read, enqueue, wake)", hooked),
                    _figures("emit -> the receiver holds the POST", heard),
                    _figures("emit -> the attempt's row in the log", logged),
                ]
        finally:
            await worker.close()
            task.cancel()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    print("\n".join(asyncio.run(run(ap.parse_args().rounds))))


if __name__ == "__main__":
    main()
