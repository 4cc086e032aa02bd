"""memory.job_status: a deferred extraction through queued -> running -> done with its
counts, and failed with a stable reason (a failing stand-in LLM, a crashing model), on
the real arq worker. Job ids do not cross namespaces or (for a pinned token) users."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from loom.providers.llm import ChatMessage, ScriptedLLM, build_llm
from tests.conversation.conftest import wait_for
from tests.memory.conftest import api_over
from tests.providers.standin import Reply, StandInServer

pytestmark = pytest.mark.timeout(90)
MSG = [{"role": "user", "content": "My two daughters start school in May."}]


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        yield srv


@pytest.fixture
def worker_llm(arq_worker: Any) -> Iterator[Any]:
    """install(llm): the worker's LLM for this test (the suite's fake comes back after)."""
    wsvc = arq_worker.ctx["loom"]
    previous = wsvc.llm

    def install(llm: Any) -> Any:
        wsvc.llm = llm
        return llm

    yield install
    wsvc.llm = previous


class HeldQueue:
    """An arq pool stand-in that keeps what the API enqueues, to release it later: the
    status can be read while the job is certainly still queued."""

    def __init__(self, real: Any) -> None:
        self.real, self.held = real, []

    async def enqueue_job(self, function: str, *args: Any, **kw: Any) -> Any:
        self.held.append((function, args, kw))
        return type("Held", (), {"job_id": kw["_job_id"]})()

    async def release(self) -> None:
        for function, args, kw in self.held:
            await self.real.enqueue_job(function, *args, **kw)


async def _status(call: Any, token: str, ns: str, job_id: str) -> dict[str, Any]:
    r = await call("memory.job_status", token, namespace=ns, job_id=job_id)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_queued_running_done_with_counts(call, ns, mint, services, arq_worker, worker_llm):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    gate = asyncio.Event()

    async def slow(msgs: list[ChatMessage]) -> str:
        await gate.wait()
        return '{"facts": ["Has two daughters", "Daughters start school in May"]}'

    worker_llm(ScriptedLLM(slow))
    held = HeldQueue(services.arq)
    async with api_over(dataclasses.replace(services, arq=held)) as held_call:
        r = await held_call(
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            session_id="s1",
            defer=True,
            messages=MSG,
        )
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    assert job_id
    got = await _status(call, v, ns, job_id)
    assert got["state"] == "queued" and got["user_id"] == "u1" and got["session_id"] == "s1"
    assert got["queued_at"] and got["counts"] is None and got["attempts"] == 0
    await held.release()
    from loom.queue import wake_workers

    await wake_workers(services.redis)

    async def state_is(state: str) -> bool:
        return (await _status(call, v, ns, job_id))["state"] == state

    assert await wait_for(lambda: state_is("running"), timeout=30)
    gate.set()
    assert await wait_for(lambda: state_is("done"), timeout=30)
    done = await _status(call, v, ns, job_id)
    assert done["counts"] == {"extracted": 2, "added": 2, "updated": 0, "deleted": 0, "left": 0}
    assert done["reason"] is None and done["extraction_id"] and done["attempts"] == 1
    assert done["started_at"] and done["finished_at"]
    facts = (await call("memory.list", w, namespace=ns, user_id="u1")).json()["facts"]
    assert sorted(f["text"] for f in facts) == ["Daughters start school in May", "Has two daughters"]


async def _deferred(call: Any, w: str, ns: str, user: str = "u1") -> str:
    r = await call("memory.set_from_messages", w, namespace=ns, user_id=user, defer=True, messages=MSG)
    assert r.status_code == 200, r.text
    return str(r.json()["job_id"])


async def _finished(call: Any, v: str, ns: str, job_id: str) -> dict[str, Any]:
    async def ended() -> bool:
        return (await _status(call, v, ns, job_id))["state"] in ("done", "failed")

    assert await wait_for(ended, timeout=30)
    return await _status(call, v, ns, job_id)


async def test_a_failing_model_is_failed_with_a_safe_reason(call, ns, mint, arq_worker, worker_llm, standin):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    worker_llm(build_llm("openai", base_url=standin.url, api_key="k", model="m", timeout=5.0))
    standin.enqueue(standin.CHAT, Reply.error(500, "upstream exploded at 10.1.2.3:8080"))
    got = await _finished(call, v, ns, await _deferred(call, w, ns))
    assert got["state"] == "failed" and got["reason"] == "llm_failed" and got["counts"] is None
    assert "10.1.2.3" not in str(got) and "exploded" not in str(got)


async def test_a_crash_in_the_job_is_failed_without_its_text(call, ns, mint, arq_worker, worker_llm):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    worker_llm(ScriptedLLM([RuntimeError("secret internal detail /var/lib/x")]))
    got = await _finished(call, v, ns, await _deferred(call, w, ns))
    assert got["state"] == "failed" and got["reason"] == "internal_error"
    assert "secret internal detail" not in str(got)


async def test_the_fake_llm_is_failed_llm_not_configured(call, ns, mint, arq_worker):
    w, v = mint(ns, "writer"), mint(ns, "viewer")
    got = await _finished(call, v, ns, await _deferred(call, w, ns))
    assert got["state"] == "failed" and got["reason"] == "llm_not_configured"


async def test_job_ids_stay_in_their_namespace_and_user(call, ns, mint, arq_worker):
    other = ns + "x"
    w = mint(ns, "writer")
    job_id = await _deferred(call, w, ns, user="u1")
    # Another namespace's token, or this job id asked in another namespace: 404.
    r = await call("memory.job_status", mint(other, "viewer"), namespace=other, job_id=job_id)
    assert r.status_code == 404 and r.json()["field"] == "job_id"
    r = await call("memory.job_status", mint([ns, other], "viewer"), namespace=other, job_id=job_id)
    assert r.status_code == 404
    # A token pinned to the job's user sees it (namespace @me works); another user's does not.
    mine = mint(ns, "viewer", "own_user", "u1")
    assert (await call("memory.job_status", mine, namespace="@me", job_id=job_id)).status_code == 200
    theirs = mint(ns, "viewer", "own_user", "u2")
    assert (await call("memory.job_status", theirs, namespace=ns, job_id=job_id)).status_code == 404
    r = await call("memory.job_status", mint(ns, "viewer"), namespace=ns, job_id="nope")
    assert r.status_code == 404


async def test_a_namespace_erasure_removes_its_job_statuses(call, ns, mint, services, arq_worker):
    from loom import redis_keys

    job_id = await _deferred(call, mint(ns, "writer"), ns)
    await _finished(call, mint(ns, "viewer"), ns, job_id)  # (a job still running would write it again)
    assert await services.redis.exists(redis_keys.memory_job(ns, job_id))
    r = await call("erasure.request", mint(ns, "admin"), namespace_list=[ns], purge=True)
    assert r.status_code == 200, r.text
    assert not await services.redis.exists(redis_keys.memory_job(ns, job_id))
