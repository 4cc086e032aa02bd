"""Bounded inputs and the answer contract: body size (413 before the body is read), the
token checked before the body, metric labels that unknown paths cannot grow, nesting
and size of free JSON, lone surrogates, one status (422) for every broken rule, and
time zones on every timestamp."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest

from loom.models.bounds import MAX_JSON_DEPTH
from tests.platform.served import serve

APPEND = "/v1/conversation.append"
CREATE = "/v1/conversation.create"


@pytest.fixture
def writer(mint: Any, ns: str) -> str:
    return str(mint(ns, "writer"))


# -- raw ASGI: see exactly what the app reads -------------------------------------------


async def _asgi(
    app: Any,
    path: str,
    headers: dict[str, str],
    chunks: list[bytes] | None = None,
    endless_chunk: bytes | None = None,
) -> tuple[int, dict[str, Any], int]:
    """(status, JSON body, request messages the app received)."""
    received = 0
    sent: list[dict[str, Any]] = []
    pending = list(chunks or [])

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        if endless_chunk is not None:
            return {"type": "http.request", "body": endless_chunk, "more_body": True}
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("loom.test", 80),
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(start["status"]), json.loads(body), received


def _app(api: Any) -> Any:
    return api._transport.app


async def test_a_declared_oversized_body_is_refused_before_it_is_read(api, writer):
    for path in (APPEND, CREATE):
        for auth in ({}, {"authorization": f"Bearer {writer}"}):  # with or without a token
            status, body, received = await _asgi(
                _app(api),
                path,
                {"content-type": "application/json", "content-length": "200000000", **auth},
                endless_chunk=b"x" * 65536,
            )
            assert status == 413 and received == 0, (path, auth, status, received)
            assert body["error"] == "body_too_large" and body["rule"] == "max_body_bytes"


async def test_a_chunked_body_stops_at_the_limit(api, writer, services):
    limit = services.settings.max_body_bytes
    chunk = b"x" * (1 << 20)
    for path in (APPEND, CREATE):  # the direct route and a FastAPI route
        status, body, received = await _asgi(
            _app(api),
            path,
            {"content-type": "application/json", "authorization": f"Bearer {writer}"},
            endless_chunk=chunk,
        )
        assert status == 413 and body["error"] == "body_too_large", (path, status, body)
        assert received <= limit // len(chunk) + 1, received  # read no further than the limit


async def test_no_token_is_refused_before_the_body_is_read(api):
    for path in (APPEND, CREATE):
        for auth in ({}, {"authorization": "Bearer loom_0000000000000000_not-a-real-secret-at-all"}):
            status, body, received = await _asgi(
                _app(api),
                path,
                {"content-type": "application/json", "content-length": "5000000", **auth},
                endless_chunk=b"{" * 65536,
            )
            assert status == 401 and received == 0 and body["error"] == "unauthorized", (path, auth, status)


async def test_a_body_within_the_limit_is_served(api, writer, ns):
    turns = [{"thread_id": "t", "role": "tool", "content": "x" * 4000, "msg_id": f"m{i}"} for i in range(500)]
    r = await api.post(
        APPEND, json={"namespace": ns, "turns": turns}, headers={"Authorization": f"Bearer {writer}"}
    )
    assert r.status_code == 200 and r.json()["stored"] == 0  # logging is off: nothing kept, nothing refused


# -- metrics -------------------------------------------------------------------------------


def _routes() -> set[str]:
    return {
        s.labels["route"]
        for m in REGISTRY.collect()
        if m.name == "loom_requests"
        for s in m.samples
        if "route" in s.labels
    }


async def test_unknown_paths_share_one_metric_label(api, mint, ns):
    await api.post("/v1/no.such.op", json={})
    before_routes, before_size = _routes(), len(generate_latest())
    for i in range(1000):
        r = await api.post(f"/v1/probe-{i}", json={})
        assert r.status_code == 404
    assert _routes() == before_routes and "unmatched" in before_routes
    assert len(generate_latest()) - before_size < 200  # counts change, no new series
    token = mint(ns, "viewer")
    r = await api.post(
        "/v1/namespace.get_config", json={"namespace": ns}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200 and "/v1/namespace.get_config" in _routes()


# -- nesting, size, surrogates: one rule, named field, 422 ----------------------------------


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _deep_json(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


async def test_metadata_nested_5000_deep_is_a_422_everywhere(api, writer, ns):
    auth = {"Authorization": f"Bearer {writer}", "Content-Type": "application/json"}
    deep = _deep_json(5000)
    bodies = {
        APPEND: f'{{"namespace": "{ns}", "thread_id": "t", "role": "user", "content": "x", "metadata": {deep}}}',
        CREATE: f'{{"namespace": "{ns}", "thread_id": "t", "metadata": {deep}}}',
        "/v1/conversation.save_message": f'{{"namespace": "{ns}", "user_id": "u", "conversation_id": "t", '
        f'"message_id": "m", "role": "user", "content": "x", "metadata": {deep}}}',
    }
    for path, body in bodies.items():
        r = await api.post(path, content=body, headers=auth)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", (path, r.status_code, r.text)


async def test_free_json_is_bounded_by_one_rule_naming_the_field(api, writer, ns):
    auth = {"Authorization": f"Bearer {writer}"}
    too_deep = _nested(MAX_JSON_DEPTH + 1)
    cases = [
        (
            APPEND,
            {"namespace": ns, "thread_id": "t", "role": "user", "content": "x", "metadata": too_deep},
            "metadata",
            "nest at most",
        ),
        (
            APPEND,
            {
                "namespace": ns,
                "turns": [{"thread_id": "t", "role": "user", "content": "x", "metadata": too_deep}],
            },
            "turns.0.metadata",
            "nest at most",
        ),
        (CREATE, {"namespace": ns, "thread_id": "t", "metadata": too_deep}, "metadata", "nest at most"),
        (
            "/v1/conversation.update",
            {"namespace": ns, "thread_id": "t", "metadata": {"k": list(range(2000))}},
            "metadata",
            "keys and items",
        ),
        (CREATE, {"namespace": ns, "thread_id": "t", "metadata": {"k": "x" * 70_000}}, "metadata", "bytes"),
    ]
    for path, body, field, rule in cases:
        r = await api.post(path, json=body, headers=auth)
        assert r.status_code == 422, (path, field, r.status_code, r.text)
        assert r.json()["field"] == field and rule in r.json()["rule"], (path, r.json())
    ok = await api.post(
        CREATE, json={"namespace": ns, "thread_id": "t", "metadata": _nested(MAX_JSON_DEPTH)}, headers=auth
    )
    assert ok.status_code == 200, ok.text


async def test_a_lone_surrogate_is_a_422_naming_the_field(api, mint, ns):
    admin = mint(ns, "admin")
    auth = {"Authorization": f"Bearer {admin}", "Content-Type": "application/json"}
    cases = [
        (
            "/v1/namespace.set_policy",
            {"namespace": ns, "model_calls_enabled": True, "extraction_policy": "\ud800"},
            "extraction_policy",
        ),
        (APPEND, {"namespace": ns, "thread_id": "t", "role": "user", "content": "a\udfffb"}, "content"),
        (
            APPEND,
            {
                "namespace": ns,
                "turns": [{"thread_id": "t", "role": "user", "content": "x", "metadata": {"\ud83d": 1}}],
            },
            "turns.0.metadata.\\ud83d",
        ),
        ("/v1/conversation.search", {"query": "\udc00"}, "query"),
    ]
    for path, body, field in cases:
        r = await api.post(path, content=json.dumps(body), headers=auth)  # json.dumps escapes: \ud800
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert r.json()["field"] == field and r.json()["rule"] == "unicode", r.json()
    pair = await api.post(
        "/v1/namespace.set_policy",
        content=json.dumps(
            {"namespace": ns, "model_calls_enabled": False, "extraction_policy": "ok \ud83d\ude00"}
        ),
        headers=auth,
    )
    assert pair.status_code == 200 and pair.json()["extraction_policy"] == "ok \U0001f600"


async def test_a_rule_the_op_checks_is_a_422_too(call, mint, ns):
    r = await call(
        "conversation.search", mint(ns, "viewer"), query="x", namespace_scope="all_mine", namespace=ns
    )
    assert (
        r.status_code == 422
        and r.json()["error"] == "invalid_request"
        and r.json()["field"] == "namespace_scope"
    )


# -- timestamps ----------------------------------------------------------------------------

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
_ZONE = re.compile(r"(Z|[+-]\d{2}:\d{2})$")


def _timestamps(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _timestamps(v)]
    if isinstance(value, list):
        return [t for v in value for t in _timestamps(v)]
    return [value] if isinstance(value, str) and _TIMESTAMP.match(value) else []


async def test_every_timestamp_in_answers_carries_its_zone(call, mint, ns):
    admin = mint(ns, "admin")
    assert (await call("conversation.set_logging", admin, namespace=ns, enabled=True)).status_code == 200
    r = await call("conversation.append", admin, namespace=ns, thread_id="t", role="tool", content="ran it")
    assert r.status_code == 200
    answers = [
        await call("conversation.create", admin, namespace=ns, thread_id="t2", title="x"),
        await call("conversation.get", admin, namespace=ns, thread_id="t", include_messages=True),
        await call("conversation.list", admin, namespace=ns, thread_id="t"),
        await call("conversation.threads", admin, namespace=ns),
        await call(
            "conversation.save_message",
            admin,
            namespace=ns,
            user_id="u",
            conversation_id="t3",
            message_id="m",
            role="user",
            content="remember the ledger",
        ),
        await call("conversation.list_saved_messages", admin, namespace=ns, user_id="u"),
        await call(
            "session.brief_save", admin, namespace=ns, brief_key="k", sections={"goal": "g"}, use_llm=False
        ),
        await call("session.brief_get", admin, namespace=ns, brief_key="k"),
        await call("session.brief_list", admin, namespace=ns),
    ]
    seen = []
    for r in answers:
        assert r.status_code == 200, r.text
        seen += _timestamps(r.json())
    assert len(seen) >= 10
    assert [t for t in seen if not _ZONE.search(t)] == []


# -- the document ---------------------------------------------------------------------------


async def test_openapi_documents_every_error_status_with_its_body(api):
    spec = (await api.get("/openapi.json")).json()
    ops = {path: item["post"] for path, item in spec["paths"].items() if path.startswith("/v1/")}
    assert len(ops) >= 20
    for path, op in ops.items():
        responses = op["responses"]
        assert {"401", "403", "413", "422", "503"} <= set(responses), path
        for status in ("401", "403", "413", "422", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
        assert "Retry-After" in responses["503"]["headers"], path
        assert "400" not in responses, path
    assert (
        "404" in ops["/v1/conversation.get"]["responses"]
        and "409" in ops["/v1/session.brief_save"]["responses"]
    )


# -- over a real socket ------------------------------------------------------------------


def _answer_without_sending_the_body(port: int, headers: str) -> tuple[int, float]:
    """Send only the request head; (status, seconds) of the answer that comes back."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(headers.encode("latin-1"))
        head = s.recv(4096).decode("latin-1")
    return int(head.split(" ", 2)[1]), time.monotonic() - started


async def test_a_real_server_refuses_before_the_body_arrives(schema, mint, ns):
    token = mint(ns, "writer")
    with serve(schema) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        cases = {
            "200 MB, no token": ("", 200_000_000, 413),
            "200 MB, a token": (f"Authorization: Bearer {token}\r\n", 200_000_000, 413),
            "1 MB, no token": ("", 1_000_000, 401),
            "1 MB, a bad token": (
                "Authorization: Bearer loom_0000000000000000_nope-nope-nope-nope\r\n",
                1_000_000,
                401,
            ),
        }
        for name, (auth, length, want) in cases.items():
            head = (
                f"POST /v1/conversation.append HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
                f"{auth}Content-Length: {length}\r\n\r\n"
            )
            status, seconds = await asyncio.to_thread(_answer_without_sending_the_body, port, head)
            assert status == want and seconds < 5, (name, status, seconds)
