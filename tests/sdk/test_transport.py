"""The SDK's transport over real HTTP (the local stand-in server): the API's error body
raised as LoomError, retries on 503 (honouring Retry-After) and connection errors for
idempotent calls only, the token from the argument or LOOM_TOKEN."""

from __future__ import annotations

import time

import pytest

from loom.sdk.transport import LoomError, Retry, Transport
from tests.providers.standin import Reply, StandInServer

OP = "/v1/conversation.append"
FAST = Retry(attempts=4, first_backoff_s=0.01, max_backoff_s=0.5)


@pytest.fixture
def server():
    with StandInServer() as srv:
        yield srv


async def test_an_answer_and_the_bearer_token(server) -> None:
    server.enqueue(OP, Reply.json({"stored": True}))
    t = Transport(server.url, "loom_abc", retry=FAST)
    try:
        assert await t.call("conversation.append", {"namespace": "acme"}) == {"stored": True}
    finally:
        await t.aclose()
    sent = server.requests_to(OP)[0]
    assert sent.headers["authorization"] == "Bearer loom_abc" and sent.json == {"namespace": "acme"}


async def test_a_refusal_carries_the_apis_code_field_and_rule(server) -> None:
    body = {"error": "invalid_request", "message": "must be 1 to 500", "field": "turns", "rule": "length"}
    server.enqueue(OP, Reply.json(body, status=422))
    t = Transport(server.url, "tok", retry=FAST)
    with pytest.raises(LoomError) as err:
        await t.call("conversation.append", {})
    await t.aclose()
    e = err.value
    assert (e.status, e.error, e.field, e.rule) == (422, "invalid_request", "turns", "length")
    assert len(server.requests_to(OP)) == 1  # a 4xx is not retried


async def test_503_is_retried_after_its_retry_after(server) -> None:
    busy = Reply.json({"error": "backend_unavailable", "message": "retry"}, status=503)
    server.enqueue(
        OP, Reply(**{**busy.__dict__, "headers": {"Retry-After": "0.3"}}), busy, Reply.json({"ok": 1})
    )
    t = Transport(server.url, "tok", retry=FAST)
    started = time.monotonic()
    assert await t.call("conversation.append", {}) == {"ok": 1}
    await t.aclose()
    assert len(server.requests_to(OP)) == 3 and time.monotonic() - started >= 0.3


async def test_a_call_that_is_not_idempotent_is_not_retried(server) -> None:
    server.enqueue(OP, Reply.json({"error": "unavailable", "message": "lease held"}, status=503))
    t = Transport(server.url, "tok", retry=FAST)
    with pytest.raises(LoomError) as err:
        await t.call("conversation.append", {}, idempotent=False)
    await t.aclose()
    assert err.value.status == 503 and len(server.requests_to(OP)) == 1


async def test_gives_up_after_its_attempts(server) -> None:
    server.set_handler(OP, Reply.json({"error": "backend_unavailable", "message": "down"}, status=503))
    t = Transport(server.url, "tok", retry=FAST)
    with pytest.raises(LoomError) as err:
        await t.call("conversation.append", {})
    await t.aclose()
    assert err.value.error == "backend_unavailable" and len(server.requests_to(OP)) == FAST.attempts


async def test_nothing_listening_is_unreachable() -> None:
    t = Transport("http://127.0.0.1:9", "tok", retry=FAST)
    with pytest.raises(LoomError) as err:
        await t.call("conversation.append", {})
    await t.aclose()
    assert err.value.status == 0 and err.value.error == "unreachable"


def test_the_token_comes_from_the_argument_or_loom_token(monkeypatch) -> None:
    monkeypatch.delenv("LOOM_TOKEN", raising=False)
    with pytest.raises(LoomError) as err:
        Transport("http://127.0.0.1:9")
    assert err.value.error == "no_token" and "LOOM_TOKEN" in str(err.value)
    monkeypatch.setenv("LOOM_TOKEN", "loom_env")
    assert Transport("http://127.0.0.1:9")._http.headers["authorization"] == "Bearer loom_env"


def test_the_sdk_loads_no_server_module() -> None:
    """`from loom import Agent` (with the API's edge models it shares) imports neither
    the server's framework nor its backends' drivers."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from loom import Agent, SyncAgent\n"
        "heavy = ('fastapi', 'clickhouse_connect', 'redis', 'arq', 'numpy', 'loom.ops', 'loom.store')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
