"""Roles and scopes of the conversation ops."""

from __future__ import annotations

import pytest

from tests.conversation.helpers import turn_rows

WRITES = {
    "conversation.append": dict(thread_id="t", role="user", content="hi"),
    "conversation.create": dict(thread_id="t", title="x"),
    "conversation.update": dict(thread_id="t", title="x"),
}
READS = {
    "conversation.threads": {},
    "conversation.get": dict(thread_id="t"),
    "conversation.list": dict(thread_id="t"),
}


async def test_viewer_cannot_write(call, ns, mint, recording, services):
    recording(ns, True)
    viewer = mint(ns, "viewer")
    for op, body in WRITES.items():
        r = await call(op, viewer, namespace=ns, **body)
        assert r.status_code == 403, op
        assert r.json()["rule"] == "role"
    r = await call("conversation.reembed", mint(ns, "writer"), namespace=ns)
    assert r.status_code == 403
    assert turn_rows(services.ch, ns) == []


@pytest.mark.parametrize("scope", ["own_user", "own_session"])
async def test_bounded_tokens_are_refused(call, ns, mint, recording, scope):
    recording(ns, True)
    extra = {"read_user_id": "u1"} if scope == "own_user" else {"read_session_id": "s1"}
    token = mint(ns, "admin", read_scope=scope, **extra)
    for op, body in {**WRITES, **READS, "conversation.reembed": {}}.items():
        for namespace in (ns, "@me"):
            r = await call(op, token, namespace=namespace, **body)
            assert r.status_code == 403, (op, r.text)
            assert r.json()["rule"] == "read_scope"


async def test_other_namespace_is_403(call, ns, mint, recording):
    recording(ns, True)
    recording(ns + "x", True)
    token = mint(ns, "admin")
    for op, body in {**WRITES, **READS, "conversation.reembed": {}}.items():
        r = await call(op, token, namespace=ns + "x", **body)
        assert r.status_code == 403, op
        assert r.json()["field"] == "namespace"
    r = await call("conversation.append", None, namespace=ns, **WRITES["conversation.append"])
    assert r.status_code == 401
