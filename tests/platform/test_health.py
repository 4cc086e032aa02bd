"""health.show: who may call it, the queue's figures read from real arq jobs (on queues
of the test's own, so the suite's worker is not disturbed), and a dead backend reported
in the answer instead of failing it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from arq.worker import Worker, func
from redis.asyncio import Redis

from loom.api.app import create_app
from loom.auth.principal import Principal, Role
from loom.errors import Forbidden
from loom.ops.platform import health, rates
from loom.providers.llm import build_llm
from loom.services import Services, redis_settings
from loom.store import queue_state
from loom.store.clickhouse import connect
from tests.asgi import in_process
from tests.relay import Relay

LEAKS = ("127.0.0.1", "Connection refused", "Errno", "http://", "redis://")


def _queue() -> str:
    return f"loom:test-health:{secrets.token_hex(4)}"


async def _drop(redis: Redis, queue: str) -> None:
    await redis.delete(queue)


@pytest.mark.parametrize(
    ("role", "scope", "status"),
    [
        ("viewer", "all", 403),
        ("writer", "all", 403),
        ("admin", "own_user", 403),
        ("admin", "all", 200),
    ],
)
async def test_only_an_unbounded_admin_may_call_it(call, mint, ns, role, scope, status):
    token = mint(ns, role, read_scope=scope, read_user_id="u" if scope != "all" else "")
    r = await call("health.show", token)
    assert r.status_code == status, r.text
    if status == 403:
        assert r.json()["error"] == "forbidden"
        assert r.json()["rule"] == ("role" if role != "admin" else "read_scope")
        return
    body = r.json()
    assert body["status"] == "ok"
    assert body["backends"]["clickhouse"] == body["backends"]["redis"] == "ok"
    assert body["backends"]["clickhouse_version"] and body["backends"]["clickhouse_uptime_s"] >= 0
    assert body["queue"]["name"] == "loom:queue" and body["queue"]["results_window_s"] == 60
    assert body["embeddings"]["rows_window_s"] == 3600 and body["embeddings"]["rows"] == []


async def test_the_op_refuses_a_bounded_admin_itself(services, ns):
    # The dashboard calls the op, not the route: the op holds the rule too.
    bounded = Principal("t", (ns,), Role.admin, read_scope="own_user", read_user_id="u")
    with pytest.raises(Forbidden):
        await health.show(services, bounded)
    with pytest.raises(Forbidden):
        await health.show(services, Principal("t", (ns,), Role.writer))


async def test_an_unknown_field_is_a_422(call, mint, ns):
    r = await call("health.show", mint(ns, "admin"), queue="other")
    assert r.status_code == 422 and r.json()["field"] == "queue"


async def test_queued_deferred_and_the_oldest_waiting_job(services):
    queue = _queue()
    arq: ArqRedis = services.arq
    now = datetime.now(UTC)
    try:
        # Nothing consumes this queue: the jobs wait.
        await arq.enqueue_job("nothing", _queue_name=queue, _defer_until=now - timedelta(seconds=30))
        await arq.enqueue_job("nothing", _queue_name=queue)
        await arq.enqueue_job("nothing", _queue_name=queue, _defer_by=timedelta(hours=1))
        q = await queue_state.queue_state(arq, queue)
        assert (q.queued, q.deferred, q.in_progress, q.in_progress_at_least) == (3, 1, 0, False)
        assert q.oldest_waiting_s is not None and 29.5 <= q.oldest_waiting_s <= 40
        assert (q.failed, q.succeeded) == (0, 0)
        empty = await queue_state.queue_state(arq, _queue())
        assert (empty.queued, empty.in_progress, empty.oldest_waiting_s) == (0, 0, None)
    finally:
        await _drop(arq, queue)


async def test_a_running_job_and_a_failed_one_from_a_real_worker(services):
    queue = _queue()
    arq: ArqRedis = services.arq
    release = asyncio.Event()

    async def hang(ctx: dict[str, Any]) -> str:
        await release.wait()
        return "done"

    async def boom(ctx: dict[str, Any]) -> None:
        raise RuntimeError("this job fails")

    worker = Worker(
        functions=[func(hang, name="hang"), func(boom, name="boom", max_tries=1)],
        queue_name=queue,
        redis_settings=redis_settings(services.settings.redis_url),
        handle_signals=False,
        poll_delay=0.02,
        keep_result=60,
    )
    task = asyncio.create_task(worker.async_run())
    try:
        running = await arq.enqueue_job("hang", _queue_name=queue)
        failing = await arq.enqueue_job("boom", _queue_name=queue)
        assert running is not None and failing is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done = await failing.result_info()
            started = await arq.exists(in_progress_key_prefix + running.job_id)
            if done is not None and started:
                break
            await asyncio.sleep(0.02)
        q = await queue_state.queue_state(arq, queue)
        assert (q.queued, q.in_progress, q.failed, q.succeeded) == (0, 1, 1, 0)
        assert q.oldest_waiting_s is None  # the one due job runs: nothing waits
        release.set()
        assert await running.result(timeout=10) == "done"
        q = await queue_state.queue_state(arq, queue)
        assert (q.queued, q.in_progress, q.failed, q.succeeded) == (0, 0, 1, 1)
        # Another queue's results are not this queue's.
        other = await queue_state.queue_state(arq, _queue())
        assert (other.failed, other.succeeded) == (0, 0)
    finally:
        release.set()
        with contextlib.suppress(Exception):
            await worker.close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await _drop(arq, queue)


async def test_the_result_scan_is_capped_and_says_at_least(services, monkeypatch):
    queue = _queue()
    arq: ArqRedis = services.arq
    worker = Worker(
        functions=[func(_fail, name="fail", max_tries=1)],
        queue_name=queue,
        redis_settings=redis_settings(services.settings.redis_url),
        handle_signals=False,
        burst=True,
        poll_delay=0.02,
        keep_result=60,
    )
    try:
        for _ in range(3):
            await arq.enqueue_job("fail", _queue_name=queue)
        await worker.async_run()
        assert (await queue_state.results_of(arq, queue)).failed == 3
        monkeypatch.setattr(queue_state, "RESULT_CAP", 1)
        capped = await queue_state.results_of(arq, queue)
        assert capped.at_least and capped.failed <= 1
        monkeypatch.setattr(queue_state, "RESULT_CAP", 1000)
        monkeypatch.setattr(queue_state, "RESULT_BYTES", 1)  # no result fits
        capped = await queue_state.results_of(arq, queue)
        assert capped.at_least and capped.failed == 0
    finally:
        with contextlib.suppress(Exception):
            await worker.close()
        await _drop(arq, queue)


async def _fail(ctx: dict[str, Any]) -> None:
    raise ValueError("no")


# -- a backend down -------------------------------------------------------------------


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: nothing listens there


@contextlib.asynccontextmanager
async def _app(services: Any, *, dead: str) -> AsyncIterator[tuple[httpx.AsyncClient, Services]]:
    """The API on services whose `dead` backend ("clickhouse", "redis" or "both")
    refuses every connection."""
    settings = services.settings
    relay = Relay(settings.clickhouse_url)
    ch = connect(f"http://127.0.0.1:{relay.port}", database=settings.clickhouse_database)
    if dead in ("clickhouse", "both"):
        relay.kill()
    dead_redis = dead in ("redis", "both")
    redis_url = f"redis://127.0.0.1:{_dead_port()}/0" if dead_redis else settings.redis_url
    redis = Redis.from_url(redis_url, socket_connect_timeout=1)
    arq = ArqRedis.from_url(redis_url, socket_connect_timeout=1)
    svc = Services(settings, ch, redis, arq, build_llm("fake"))
    try:
        async with in_process(create_app(svc), "http://dead.test") as client:
            yield client, svc
    finally:
        await svc.close()
        relay.kill()


@pytest.mark.parametrize("dead", ["clickhouse", "redis"])
async def test_a_dead_backend_is_reported_not_a_503(services, api, mint, ns, dead):
    headers = {"Authorization": f"Bearer {mint(ns, 'admin')}"}
    # Verified once on the live API: cached, so only the op meets the dead backend.
    assert (await api.post("/v1/health.show", json={}, headers=headers)).status_code == 200
    async with _app(services, dead=dead) as (client, _):
        r = await client.post("/v1/health.show", json={}, headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "degraded"
    alive = "redis" if dead == "clickhouse" else "clickhouse"
    assert body["backends"][alive] == "ok"
    assert body["backends"][dead].startswith("down: ") and len(body["backends"][dead].split()) == 2
    if dead == "clickhouse":
        assert body["backends"]["clickhouse_version"] is None and body["embeddings"]["rows"] is None
        assert body["queue"]["name"] == "loom:queue"
    else:
        assert body["queue"] is None and body["embeddings"]["rows"] == []
        assert body["backends"]["clickhouse_version"]
    for leak in LEAKS:
        assert leak not in r.text, (leak, r.text)


async def test_the_token_check_with_clickhouse_down_is_the_usual_503(services, mint, ns):
    token = mint(ns, "admin")  # never verified: not in the token cache
    async with _app(services, dead="clickhouse") as (client, _):
        r = await client.post("/v1/health.show", json={}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 503 and r.json()["error"] == "backend_unavailable"


async def test_both_backends_down_the_op_still_answers(services, ns):
    async with _app(services, dead="both") as (_, svc):
        report = await health.show(svc, Principal("t", (ns,), Role.admin))
    assert report.status == "degraded" and report.queue is None and report.embeddings.rows is None
    assert report.backends.clickhouse.startswith("down: ") and report.backends.redis.startswith("down: ")
    assert report.backends.clickhouse_version is None


def test_the_sampler_answers_over_the_last_minute_of_readings():
    clock, count = [0.0], [0.0]
    sampler = rates.Sampler(read=lambda: rates.Totals(append_requests=count[0]), clock=lambda: clock[0])
    for _ in range(30):  # a reading every 10 s at 1 append/s
        sampler.sample()
        clock[0] += 10.0
        count[0] += 10.0
    count[0] += 600.0  # then a burst of 600 appends
    clock[0] += 0.5
    window, totals = sampler.rates()
    assert totals.append_requests == 900.0
    # From the oldest reading within the last 60 s (t=250, 250 appends) to now (t=300.5).
    assert window.window_s == 50.5 and window.append_requests_per_s == round(650 / 50.5, 3)
    for _ in range(500):  # a busy dashboard: the ring stays bounded
        clock[0] += 0.1
        sampler.rates()
    assert len(sampler._ring) <= rates._KEPT
