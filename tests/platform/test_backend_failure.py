"""A backend that is down answers 503 `backend_unavailable` with Retry-After in every op,
the token lookup included, and the answer never carries the driver's text.

The dead backends are real sockets that refuse: for Redis a port nothing listens on;
for ClickHouse a TCP relay to the live endpoint, through which the client connects (its
start-up queries the server), and which is then shut with every connection it carried.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from arq.connections import ArqRedis
from redis.asyncio import Redis

from loom.api.app import create_app
from loom.providers.llm import build_llm
from loom.services import Services
from loom.store.clickhouse import connect
from tests.asgi import in_process
from tests.relay import Relay

# A minimal valid body per op (namespace filled in by the test).
BODIES: dict[str, dict[str, Any]] = {
    "conversation.set_logging": {"enabled": True},
    "namespace.get_config": {},
    "namespace.set_policy": {"model_calls_enabled": False},
    "conversation.append": {"thread_id": "t", "role": "user", "content": "hello there"},
    "conversation.create": {"thread_id": "t"},
    "conversation.update": {"thread_id": "t", "title": "x"},
    "conversation.threads": {},
    "conversation.get": {"thread_id": "t", "include_messages": True},
    "conversation.list": {"thread_id": "t"},
    "conversation.reembed": {},
    "conversation.search": {"query": "hello", "namespace_scope": "one"},
    "conversation.save_message": {
        "user_id": "u",
        "conversation_id": "t",
        "message_id": "m",
        "role": "user",
        "content": "keep this",
    },
    "conversation.unsave_message": {"user_id": "u", "conversation_id": "t", "message_id": "m"},
    "conversation.list_saved_messages": {"user_id": "u"},
    "conversation.saved_status": {"user_id": "u", "conversation_id": "t", "message_ids": ["m"]},
    "conversation.search_saved_messages": {"user_id": "u", "query": "keep"},
    "session.brief_save": {"brief_key": "k", "sections": {"goal": "ship it"}, "use_llm": False},
    "session.brief_get": {"brief_key": "k"},
    "session.brief_list": {},
    "session.brief_delete": {"brief_key": "k"},
}


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: nothing listens there


@contextlib.asynccontextmanager
async def _app(
    services: Any, *, dead_clickhouse: bool, dead_redis: bool
) -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    settings = services.settings
    port = _dead_port()
    relay = Relay(settings.clickhouse_url)
    ch = connect(f"http://127.0.0.1:{relay.port}", database=settings.clickhouse_database)
    if dead_clickhouse:
        relay.kill()  # every query now meets a refused connection
        port = relay.port
    redis_url = f"redis://127.0.0.1:{port}/0" if dead_redis else settings.redis_url
    redis = Redis.from_url(redis_url, socket_connect_timeout=1)
    arq = ArqRedis.from_url(redis_url, socket_connect_timeout=1)
    svc = Services(settings, ch, redis, arq, build_llm("fake"))
    app = create_app(svc)
    try:
        async with in_process(app, "http://dead.test") as client:
            yield client, port
    finally:
        await svc.close()
        relay.kill()


def _assert_clean_503(r: httpx.Response, port: int, what: str) -> None:
    assert r.status_code == 503, (what, r.status_code, r.text)
    body = r.json()
    assert body["error"] in ("backend_unavailable", "unavailable"), (what, body)
    assert int(r.headers["retry-after"]) >= 1, what
    for leak in (str(port), "127.0.0.1", "Connection refused", "Errno", "param_", "http://"):
        assert leak not in r.text, (what, leak, r.text)


async def test_the_token_lookup_with_clickhouse_down_answers_503(services, mint, ns):
    token = mint(ns, "admin")  # never verified yet: not in the token cache
    async with _app(services, dead_clickhouse=True, dead_redis=False) as (client, port):
        r = await client.post(
            "/v1/conversation.threads", json={"namespace": ns}, headers={"Authorization": f"Bearer {token}"}
        )
    _assert_clean_503(r, port, "token lookup")
    assert r.json()["error"] == "backend_unavailable"


@pytest.mark.parametrize("dead", ["clickhouse", "redis"])
async def test_every_op_answers_503_when_a_backend_is_down(services, api, mint, ns, dead):
    token = mint(ns, "admin")
    headers = {"Authorization": f"Bearer {token}"}
    # Verified once on the live API: cached, so the ops themselves meet the dead backend.
    assert (
        await api.post("/v1/namespace.get_config", json={"namespace": ns}, headers=headers)
    ).status_code == 200
    assert (
        await api.post(
            "/v1/conversation.set_logging", json={"namespace": ns, "enabled": True}, headers=headers
        )
    ).status_code == 200
    answered: dict[str, int] = {}
    async with _app(services, dead_clickhouse=dead == "clickhouse", dead_redis=dead == "redis") as (
        client,
        port,
    ):
        for op, body in BODIES.items():
            r = await client.post(f"/v1/{op}", json={"namespace": ns, **body}, headers=headers)
            answered[op] = r.status_code
            assert r.status_code < 500 or r.status_code == 503, (op, r.status_code, r.text)
            if r.status_code == 503:
                _assert_clean_503(r, port, op)
    if dead == "clickhouse":  # every op reads or writes the store
        assert {op: s for op, s in answered.items() if s != 503} == {}
    else:  # ops that need Redis (leases, the write path's queue) fail cleanly
        assert answered["conversation.append"] == 503 and answered["conversation.save_message"] == 503, (
            answered
        )


async def test_healthz_without_a_token_shows_status_only(services, mint, ns):
    async with _app(services, dead_clickhouse=True, dead_redis=True) as (client, port):
        r = await client.get("/healthz")
        assert r.status_code == 503 and r.json() == {"status": "degraded"} and r.headers["retry-after"]
        # A token cannot be checked while the store is down: still the short answer.
        r = await client.get("/healthz", headers={"Authorization": f"Bearer {mint(ns, 'viewer')}"})
        assert r.json() == {"status": "degraded"}
    async with _app(services, dead_clickhouse=False, dead_redis=True) as (client, port):
        r = await client.get("/healthz", headers={"Authorization": f"Bearer {mint(ns, 'viewer')}"})
        body = r.json()
        assert r.status_code == 503 and body["clickhouse"] == "ok" and body["redis"].startswith("down")
        assert str(port) not in r.text and "Errno" not in r.text
