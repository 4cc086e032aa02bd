"""Bearer auth and role checks on an admin op, end to end over the API."""

from __future__ import annotations

import pytest

from loom.store import namespaces


async def test_set_logging_roles(call, mint, ns, services):
    admin, writer, viewer = mint(ns, "admin"), mint(ns, "writer"), mint(ns, "viewer")
    assert namespaces.get(services.ch, ns).conversation_logging_enabled is False  # no row: off

    r = await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    assert r.status_code == 200, r.text
    assert r.json()["conversation_logging_enabled"] is True
    assert namespaces.get(services.ch, ns).conversation_logging_enabled is True

    for token in (writer, viewer):
        r = await call("conversation.set_logging", token, namespace=ns, enabled=False)
        assert r.status_code == 403
        assert r.json()["error"] == "forbidden"
    r = await call("conversation.set_logging", None, namespace=ns, enabled=False)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert namespaces.get(services.ch, ns).conversation_logging_enabled is True


async def test_bad_tokens_are_401(call, ns):
    for token in ("nope", "loom_0123456789abcdef_" + "x" * 30):
        r = await call("conversation.set_logging", token, namespace=ns, enabled=True)
        assert r.status_code == 401


async def test_other_namespace_is_403(call, mint, ns):
    token = mint(ns, "admin")
    r = await call("conversation.set_logging", token, namespace=ns + "x", enabled=True)
    assert r.status_code == 403
    assert r.json()["field"] == "namespace"


async def test_role_checked_before_body(call, mint, ns):
    viewer = mint(ns, "viewer")
    r = await call("conversation.set_logging", viewer, namespace=ns)  # body also invalid
    assert r.status_code == 403


@pytest.mark.parametrize(
    "body,field",
    [
        ({"enabled": True}, "namespace"),
        ({"namespace": "bad ns!", "enabled": True}, "namespace"),
        ({"namespace": "ok", "enabled": "maybe"}, "enabled"),
        ({"namespace": "ok", "enabled": True, "surprise": 1}, "surprise"),
    ],
)
async def test_bad_input_is_422_naming_the_field(call, mint, ns, body, field):
    r = await call("conversation.set_logging", mint(ns, "admin"), **body)
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_request"
    assert r.json()["field"] == field


async def test_revoked_token(call, mint, ns, services):
    from loom.auth import tokens

    token = mint(ns, "admin")
    assert (await call("conversation.set_logging", token, namespace=ns, enabled=True)).status_code == 200
    token_id = token.split("_")[1]
    assert tokens.revoke(services.ch, token_id)
    assert (await call("conversation.set_logging", token, namespace=ns, enabled=True)).status_code == 401


async def test_bounded_token_refused_on_admin_op(call, mint, ns):
    token = mint(ns, "admin", read_scope="own_user", read_user_id="u1")
    r = await call("conversation.set_logging", token, namespace=ns, enabled=True)
    assert r.status_code == 403


async def test_healthz_and_metrics(api, mint, ns):
    r = await api.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}  # no details without a token
    r = await api.get("/healthz", headers={"Authorization": f"Bearer {mint(ns, 'viewer')}"})
    assert r.status_code == 200 and r.json() == {
        "status": "ok",
        "clickhouse": "ok",
        "redis": "ok",
        "capabilities": ["saved_state_preserved_in_compaction"],
    }
    r = await api.get("/metrics")
    assert r.status_code == 200 and "loom_requests_total" in r.text


async def test_openapi_lists_ops(api):
    spec = (await api.get("/openapi.json")).json()
    assert "/v1/conversation.set_logging" in spec["paths"]
