"""The errors a person meets first with curl name the mistake, in Loom's one error shape:
malformed JSON says where (line and column), a body sent without a JSON content type is
read as JSON, a body that is no JSON object says what it is, and an unknown op is
named with the nearest ones that exist."""

from __future__ import annotations

from typing import Any

SET_LOGGING = "/v1/conversation.set_logging"


def _auth(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}


def _shape(body: dict[str, Any]) -> None:
    assert {"error", "message"} <= set(body), body


async def test_malformed_json_names_the_line_and_column_not_an_offset(api, mint, ns):
    token = mint(ns, "admin")
    sent = '{"namespace": "' + ns + '",\n  "enabled": true,}'
    r = await api.post(
        SET_LOGGING, content=sent, headers=_auth(token, **{"content-type": "application/json"})
    )
    assert r.status_code == 422
    body = r.json()
    _shape(body)
    assert body["error"] == "invalid_request" and body["field"] == "body"
    assert body["rule"].startswith("body is not valid JSON (line 2, column 19)"), body
    assert body["message"] == f"body: {body['rule']}"
    assert [e["field"] for e in body["errors"]] == ["body"]  # never the character offset


async def test_json_sent_without_a_json_content_type_is_accepted(api, mint, ns):
    token = mint(ns, "admin")
    sent = '{"namespace": "' + ns + '", "enabled": true}'
    for headers in (
        {},  # no content type at all
        {"content-type": "application/x-www-form-urlencoded"},  # what `curl -d` sends
        {"content-type": "text/plain; charset=utf-8"},
    ):
        r = await api.post(SET_LOGGING, content=sent, headers=_auth(token, **headers))
        assert r.status_code == 200, (headers, r.text)
        assert r.json()["conversation_logging_enabled"] is True
    # The hot path (conversation.append's direct route) reads it the same way (a tool turn: no embedding to wait for).
    turn = '{"namespace": "' + ns + '", "thread_id": "t", "role": "tool", "content": "ran it"}'
    r = await api.post("/v1/conversation.append", content=turn, headers=_auth(token))
    assert r.status_code == 200 and r.json()["stored"] is True, r.text


async def test_a_body_that_is_no_json_object_says_what_it_is(api, mint, ns):
    token = mint(ns, "admin")
    r = await api.post(
        SET_LOGGING, content="[1, 2]", headers=_auth(token, **{"content-type": "application/json"})
    )
    assert r.status_code == 422
    assert r.json()["field"] == "body" and r.json()["rule"] == "the body must be a JSON object, not an array"
    r = await api.post(
        SET_LOGGING,
        content="--x\r\n\r\n--x--",
        headers=_auth(token, **{"content-type": "multipart/form-data"}),
    )
    assert r.status_code == 422
    assert "content-type: application/json" in r.json()["rule"]
    assert "multipart/form-data" in r.json()["rule"], r.json()


async def test_an_unknown_op_is_named_with_the_nearest_ones(api, mint, ns):
    token = mint(ns, "admin")
    r = await api.post("/v1/conversation.setlogging", json={"namespace": ns}, headers=_auth(token))
    assert r.status_code == 404
    body = r.json()
    _shape(body)
    assert body["error"] == "not_found" and body["rule"] == "unknown_op" and body["field"] == "op"
    assert "'conversation.setlogging'" in body["message"]
    assert body["suggestions"][0] == "conversation.set_logging"
    assert "did you mean conversation.set_logging" in body["message"]
    r = await api.post("/v1/zzzz", json={})  # nothing near: where the list is
    assert r.json()["suggestions"] == [] and "GET /docs" in r.json()["message"]
    r = await api.get(SET_LOGGING, headers=_auth(token))
    assert r.status_code == 405
    assert r.json()["error"] == "method_not_allowed" and "POST /v1/<op name>" in r.json()["message"]
