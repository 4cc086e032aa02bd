"""Signed webhooks: registration rules and roles, the signature (checked with the SDK's
helper), retries with backoff against a local receiver that fails first, the delivery
log, and each event: memory.extracted (inline and deferred), conversation.compacted,
erasure.completed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from loom.providers.llm import OpenAICompatLLM, ScriptedLLM
from loom.sdk.webhooks import SignatureError, signature_header, verify_signature
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import ok
from tests.memory.conftest import api_over
from tests.providers.standin import StandInServer
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.timeout(120)
SAID = "My two daughters start school in May."


async def _register(call: Any, admin: str, ns: str, url: str, **body: Any) -> dict[str, Any]:
    return await ok(call, "webhook.register", admin, namespace=ns, url=url, **body)


async def _log(call: Any, admin: str, ns: str, **body: Any) -> list[dict[str, Any]]:
    got = await ok(call, "webhook.deliveries", admin, namespace=ns, **body)
    return list(reversed(got["deliveries"]))  # oldest first


async def _until_logged(call: Any, admin: str, ns: str, n: int, timeout: float = 30) -> list[dict[str, Any]]:
    async def enough() -> bool:
        return len(await _log(call, admin, ns)) >= n

    assert await wait_for(enough, timeout=timeout, step=0.1)
    return await _log(call, admin, ns)


# -- registration ------------------------------------------------------------------------


async def test_register_list_rotate_delete_and_the_rules(call, ns, mint):
    admin = mint(ns, "admin")
    for role in ("writer", "viewer"):
        r = await call("webhook.register", mint(ns, role), namespace=ns, url="https://example.com/h")
        assert r.status_code == 403, role
    r = await call(
        "webhook.register", mint(ns, "admin", "own_user", "u1"), namespace=ns, url="https://example.com/h"
    )
    assert r.status_code == 403
    for url, rule in (
        ("ftp://example.com/h", "http_or_https"),
        ("example.com/h", "http_or_https"),
        ("https:///nohost", "host_required"),
        ("https://user:pw@example.com/h", "no_credentials"),
        ("https://example.com:99999/h", "url"),
    ):
        r = await call("webhook.register", admin, namespace=ns, url=url)
        assert r.status_code == 422 and r.json()["field"] == "url" and r.json()["rule"] == rule, (url, r.text)
    r = await call(
        "webhook.register", admin, namespace=ns, url="https://example.com/h", events=["memory.gone"]
    )
    assert r.status_code == 422 and r.json()["field"] == "events[0]" and r.json()["rule"] == "one_of"
    r = await call("webhook.register", admin, namespace=ns, url="https://example.com/h", events=[])
    assert r.status_code == 422 and r.json()["field"] == "events"
    assert (await ok(call, "webhook.list", admin, namespace=ns))["webhooks"] == []  # nothing written
    first = await _register(call, admin, ns, "https://example.com/a", events=["memory.extracted"])
    assert first["secret"].startswith("whsec_") and len(first["secret"]) == 6 + 64
    second = await _register(call, admin, ns, "http://example.com/b")
    assert second["secret"] is None  # shown once per namespace
    assert second["webhook"]["events"] == ["memory.extracted", "conversation.compacted", "erasure.completed"]
    listed = await ok(call, "webhook.list", admin, namespace=ns)
    assert [h["url"] for h in listed["webhooks"]] == ["https://example.com/a", "http://example.com/b"]
    assert "secret" not in json.dumps(listed) and first["secret"] not in json.dumps(listed)
    rotated = await ok(call, "webhook.rotate_secret", admin, namespace=ns)
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != first["secret"]
    gone = await ok(call, "webhook.delete", admin, namespace=ns, webhook_id=first["webhook"]["webhook_id"])
    assert gone["deleted"] is True
    listed = await ok(call, "webhook.list", admin, namespace=ns)
    assert [h["webhook_id"] for h in listed["webhooks"]] == [second["webhook"]["webhook_id"]]
    r = await call("webhook.delete", admin, namespace=ns, webhook_id=first["webhook"]["webhook_id"])
    assert r.status_code == 404
    # Another namespace sees none of it.
    other = ns + "x"
    assert (await ok(call, "webhook.list", mint(other, "admin"), namespace=other))["webhooks"] == []
    r = await call(
        "webhook.delete", mint(other, "admin"), namespace=other, webhook_id=second["webhook"]["webhook_id"]
    )
    assert r.status_code == 404


def test_the_sdk_helper_verifies_and_refuses():
    body = b'{"id":"evt_1","type":"memory.extracted"}'
    header = signature_header("whsec_k", body, timestamp=1_000)
    assert verify_signature(body, header, "whsec_k", now=1_100) == 1_000
    for bad_body, secret, now in (
        (body + b" ", "whsec_k", 1_100),
        (body, "whsec_other", 1_100),
        (body, "whsec_k", 9_999),
    ):
        with pytest.raises(SignatureError):
            verify_signature(bad_body, header, secret, now=now)
    with pytest.raises(SignatureError):
        verify_signature(body, None, "whsec_k")
    with pytest.raises(SignatureError):
        verify_signature(body, "v1=abc", "whsec_k")
    # Several v1 signatures: any may match.
    assert verify_signature(body, header + ",v1=00", "whsec_k", now=1_000) == 1_000


# -- deliveries --------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(fail_first=2) as r:
        yield r


async def test_memory_extracted_is_signed_retried_with_backoff_and_logged(
    call, ns, mint, services, arq_worker, worker_settings, receiver
):
    admin, w = mint(ns, "admin"), mint(ns, "writer")
    reg = await _register(call, admin, ns, receiver.url, events=["memory.extracted"])
    secret, hook = reg["secret"], reg["webhook"]["webhook_id"]
    llm = ScriptedLLM(['{"facts": ["Has two daughters"]}'])
    async with api_over(dataclasses.replace(services, llm=llm)) as llm_call:
        r = await llm_call(
            "memory.set_from_messages",
            w,
            namespace=ns,
            user_id="u1",
            messages=[{"role": "user", "content": SAID}],
        )
    assert r.status_code == 200, r.text
    extraction = r.json()
    rows = await _until_logged(call, admin, ns, 3)
    assert [(d["attempt"], d["status_code"], d["error"], d["outcome"]) for d in rows] == [
        (1, 500, "http_status", "retrying"),
        (2, 500, "http_status", "retrying"),
        (3, 200, "", "delivered"),
    ]
    assert {d["webhook_id"] for d in rows} == {hook} and {d["event"] for d in rows} == {"memory.extracted"}
    assert len({d["event_id"] for d in rows}) == 1
    assert rows[0]["next_attempt_at"] and rows[2]["next_attempt_at"] is None
    # Each attempt signed (its own t), the same body; waits of at least 0.2 s then 0.4 s.
    assert len(receiver.received) == 3
    bodies = {got.body for got in receiver.received}
    assert len(bodies) == 1
    for got in receiver.received:
        verify_signature(got.body, got.headers["loom-signature"], secret)
        assert (
            got.headers["loom-event"] == "memory.extracted"
            and got.headers["content-type"] == "application/json"
        )
    gaps = [b.at - a.at for a, b in zip(receiver.received, receiver.received[1:], strict=False)]
    assert gaps[0] >= 0.18 and gaps[1] >= 0.36, gaps
    event = json.loads(receiver.received[0].body)
    assert (
        event["type"] == "memory.extracted"
        and event["namespace"] == ns
        and event["id"] == rows[0]["event_id"]
    )
    assert event["data"] == {
        "user_id": "u1",
        "session_id": "",
        "run_id": "",
        "extraction_id": extraction["extraction_id"],
        "job_id": None,
        "evidence": 1,
        "extracted": 1,
        "added": 1,
        "updated": 0,
        "deleted": 0,
        "left": 0,
    }
    # Ids and counts only: neither the message nor the fact is in the body.
    assert "daughters" not in receiver.received[0].body.decode().lower()
    # The log filters by webhook and event.
    assert len(await _log(call, admin, ns, webhook_id=hook, event_id=rows[0]["event_id"])) == 3
    assert await _log(call, admin, ns, webhook_id="wh_other") == []


async def test_a_deferred_extraction_emits_with_its_job_id(call, ns, mint, arq_worker, worker_settings):
    admin, w = mint(ns, "admin"), mint(ns, "writer")
    wsvc = arq_worker.ctx["loom"]
    before = wsvc.llm
    wsvc.llm = ScriptedLLM(['{"facts": ["Has two daughters"]}'])
    try:
        with Receiver() as rec:
            reg = await _register(call, admin, ns, rec.url)
            r = await call(
                "memory.set_from_messages",
                w,
                namespace=ns,
                user_id="u1",
                defer=True,
                messages=[{"role": "user", "content": SAID}],
            )
            job_id = r.json()["job_id"]
            await _until_logged(call, admin, ns, 1)
            event = json.loads(rec.received[0].body)
            verify_signature(rec.received[0].body, rec.received[0].headers["loom-signature"], reg["secret"])
    finally:
        wsvc.llm = before
    assert event["type"] == "memory.extracted" and event["data"]["job_id"] == job_id
    assert event["data"]["added"] == 1


async def test_gives_up_after_the_attempts_and_never_follows_a_redirect(
    call, ns, mint, arq_worker, worker_settings
):
    admin = mint(ns, "admin")
    worker_settings(webhook_backoff_seconds=0.1, webhook_max_attempts=3)
    with Receiver(fail_first=100) as target, Receiver(fail_first=100, fail_status=302, location="") as hop:
        hop.location = target.url
        await _register(call, admin, ns, hop.url, events=["erasure.completed"])
        await ok(call, "erasure.request", admin, user_id="nobody")
        rows = await _until_logged(call, admin, ns, 3)
        assert [(d["attempt"], d["status_code"], d["error"], d["outcome"]) for d in rows] == [
            (1, 302, "redirect", "retrying"),
            (2, 302, "redirect", "retrying"),
            (3, 302, "redirect", "gave_up"),
        ]
        assert len(hop.received) == 3 and target.received == []
    # Nothing answers at all: connect_failed.
    other = ns + "c"
    admin2 = mint(other, "admin")
    with Receiver() as closed:
        url = closed.url
    await _register(call, admin2, other, url, events=["erasure.completed"])
    await ok(call, "erasure.request", admin2, user_id="nobody", namespaces=[other])
    rows = await _until_logged(call, admin2, other, 3)
    assert [(d["status_code"], d["error"]) for d in rows] == [(0, "connect_failed")] * 3


async def test_erasure_completed(call, ns, mint, arq_worker, worker_settings, receiver):
    admin, w = mint(ns, "admin"), mint(ns, "writer")
    receiver.fail_first = 0
    reg = await _register(call, admin, ns, receiver.url, events=["erasure.completed"])
    await ok(call, "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Collects vinyl records"}])
    got = await ok(call, "erasure.request", admin, user_id="u1")
    rows = await _until_logged(call, admin, ns, 1)
    assert rows[0]["outcome"] == "delivered" and rows[0]["event"] == "erasure.completed"
    event = json.loads(receiver.received[0].body)
    verify_signature(receiver.received[0].body, receiver.received[0].headers["loom-signature"], reg["secret"])
    assert event["data"]["erasure_id"] == got["erasure_id"] and event["data"]["kind"] == "user"
    assert event["data"]["removed"]["memories"] >= 1
    assert (
        "u1" not in receiver.received[0].body.decode() and "vinyl" not in receiver.received[0].body.decode()
    )
    status = await ok(call, "erasure.status", admin, erasure_id=got["erasure_id"])
    assert status["state"] == "done"


@pytest.fixture
def summarizer(services: Any, arq_worker: Any) -> Iterator[StandInServer]:
    with StandInServer() as srv:
        srv.set_handler(srv.CHAT, lambda req: srv.chat_ok("They planned the storage cluster migration."))
        worker = arq_worker.ctx["loom"]
        before = services.llm, worker.llm
        services.llm = worker.llm = OpenAICompatLLM(base_url=srv.url, model="stand-in", timeout=5.0)
        yield srv
        services.llm, worker.llm = before


async def test_conversation_compacted(
    call, ns, mint, services, arq_worker, worker_settings, receiver, summarizer
):
    from loom.store import namespaces, recording_cache

    admin, w = mint(ns, "admin"), mint(ns, "writer")
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    receiver.fail_first = 0
    reg = await _register(call, admin, ns, receiver.url, events=["conversation.compacted"])
    turns = [
        {
            "thread_id": "t",
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: the storage plan",
        }
        for i in range(12)
    ]
    await ok(call, "conversation.append", w, namespace=ns, agent="a", turns=turns)
    got = await ok(call, "conversation.compact", w, namespace=ns, agent="a", thread_id="t", keep_recent=4)
    assert got["summary_msg_id"] and got["messages_summarized"] == 8, {k: got[k] for k in ("reason", "note")}
    rows = await _until_logged(call, admin, ns, 1)
    assert rows[0]["outcome"] == "delivered" and rows[0]["event"] == "conversation.compacted"
    event = json.loads(receiver.received[0].body)
    verify_signature(receiver.received[0].body, receiver.received[0].headers["loom-signature"], reg["secret"])
    assert event["data"] == {
        "agent": "a",
        "thread_id": "t",
        "messages_summarized": 8,
        "summaries_replaced": 0,
        "summary_msg_id": got["summary_msg_id"],
    }
    assert "storage" not in receiver.received[0].body.decode()


async def test_a_deleted_webhooks_queued_attempts_are_dropped(
    call, ns, mint, arq_worker, worker_settings, receiver
):
    admin = mint(ns, "admin")
    worker_settings(webhook_backoff_seconds=1.0)
    receiver.fail_first = 100
    reg = await _register(call, admin, ns, receiver.url, events=["erasure.completed"])
    await ok(call, "erasure.request", admin, user_id="nobody")
    await _until_logged(call, admin, ns, 1)
    await ok(call, "webhook.delete", admin, namespace=ns, webhook_id=reg["webhook"]["webhook_id"])
    rows = await _until_logged(call, admin, ns, 2)
    assert [(d["attempt"], d["error"], d["outcome"]) for d in rows] == [
        (1, "http_status", "retrying"),
        (2, "webhook_gone", "dropped"),
    ]
    assert len(receiver.received) == 1


async def test_a_slow_receiver_times_out(call, ns, mint, arq_worker, worker_settings):
    admin = mint(ns, "admin")
    worker_settings(webhook_timeout_seconds=0.3, webhook_max_attempts=1)
    with Receiver(delay_s=1.5) as slow:
        await _register(call, admin, ns, slow.url, events=["erasure.completed"])
        await ok(call, "erasure.request", admin, user_id="nobody")
        rows = await _until_logged(call, admin, ns, 1)
    assert [(d["attempt"], d["status_code"], d["error"], d["outcome"]) for d in rows] == [
        (1, 0, "timeout", "gave_up")
    ]
    assert rows[0]["duration_ms"] < 1_400


async def test_the_sdk_manages_webhooks_and_asks(api_url, ns, mint, arq_worker, worker_settings):
    from loom import Agent, LoomError

    admin = mint(ns, "admin")
    async with Agent(ns, "dev", "bot", base_url=api_url, token=admin) as bot:
        with Receiver() as rec:
            got = await bot.webhooks.register(url=rec.url, events=["erasure.completed"])
            assert got.secret and got.webhook.events == ["erasure.completed"]
            assert [h.webhook_id for h in (await bot.webhooks.list()).webhooks] == [got.webhook.webhook_id]
            await bot.erasure.request(user_id="nobody")
            await _until_logged(call_of(bot), admin, ns, 1)
            deliveries = (await bot.webhooks.deliveries(webhook_id=got.webhook.webhook_id)).deliveries
            assert [(d.outcome, d.event) for d in deliveries] == [("delivered", "erasure.completed")]
            verify_signature(rec.received[0].body, rec.received[0].headers["loom-signature"], got.secret)
            rotated = (await bot.webhooks.rotate_secret()).secret
            assert rotated != got.secret
            assert (await bot.webhooks.delete(webhook_id=got.webhook.webhook_id)).deleted
        with pytest.raises(LoomError) as bad:
            await bot.webhooks.register(url="ftp://example.com/h")
        assert bad.value.status == 422 and bad.value.field == "url"
        answer = await bot.memory.ask(user_id="u1", question="What does the user collect?")
        assert answer.answer is None and answer.reason == "llm_not_configured" and answer.citations == []
        r = await bot.memory.set_from_messages(
            user_id="u1", defer=True, messages=[{"role": "user", "content": "I collect vinyl records."}]
        )
        assert r.job_id
        status = await bot.memory.job_status(job_id=r.job_id)
        assert status.job_id == r.job_id and status.state in ("queued", "running", "failed")


def call_of(bot: Any) -> Any:
    """The op caller _until_logged expects, over the SDK's transport."""

    class Answer:
        def __init__(self, body: Any) -> None:
            self.status_code, self._body = 200, body

        def json(self) -> Any:
            return self._body

        @property
        def text(self) -> str:
            return json.dumps(self._body)

    async def call(op: str, token: str, **body: Any) -> Any:
        return Answer(await bot.transport.call(op, body))

    return call
