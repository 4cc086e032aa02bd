"""The brief routes over HTTP with minted tokens: key addressing under each token kind,
bad input as a 4xx naming the field, 409 and 503 bodies."""

from __future__ import annotations

import pytest

from loom.providers.llm import LLMError, ScriptedLLM
from tests.briefs.conftest import api_over

pytestmark = pytest.mark.timeout(60)


async def save(call, token, ns, **body):
    return await call("session.brief_save", token, namespace=ns, **body)


async def test_key_addressing_under_each_token_kind(call, mint, ns):
    wide = mint(ns, "writer")
    user = mint(ns, "writer", read_scope="own_user", read_user_id="u1")
    user2 = mint(ns, "writer", read_scope="own_user", read_user_id="u2")
    sess = mint(ns, "writer", read_scope="own_session", read_user_id="u1", read_session_id="s1")

    for token, goal in ((wide, "wide"), (user, "user"), (sess, "session")):
        r = await save(call, token, ns, brief_key="plan", sections={"goal": goal})
        assert r.status_code == 200, r.text
        assert r.json()["brief_key"] == "plan"

    # Each bounded token sees its own brief under the bare key.
    for token, goal in ((wide, "wide"), (user, "user"), (sess, "session")):
        r = await call("session.brief_get", token, namespace=ns, brief_key="plan")
        assert (
            r.status_code == 200 and r.json()["sections"]["goal"] == goal and r.json()["brief_key"] == "plan"
        )
    assert (await call("session.brief_get", user2, namespace=ns, brief_key="plan")).status_code == 404

    # The namespace-wide token lists them with their prefix and gets them by it.
    listed = (await call("session.brief_list", wide, namespace=ns)).json()["briefs"]
    assert sorted(b["brief_key"] for b in listed) == ["plan", "~u1~plan", "~u1~s1~plan"]
    r = await call("session.brief_get", wide, namespace=ns, brief_key="~u1~s1~plan")
    assert r.json()["sections"]["goal"] == "session"
    # Bounded tokens list only their own, unprefixed.
    assert [
        b["brief_key"] for b in (await call("session.brief_list", user, namespace=ns)).json()["briefs"]
    ] == ["plan"]
    assert [
        b["brief_key"] for b in (await call("session.brief_list", sess, namespace="@me")).json()["briefs"]
    ] == ["plan"]

    # A bounded token cannot send a `~` key, nor act for another user or session.
    for body in ({"brief_key": "~u1~plan"}, {"brief_key": "~u2~plan"}):
        r = await call("session.brief_get", user, namespace=ns, **body)
        assert r.status_code == 403 and r.json()["field"] == "brief_key"
    r = await save(call, user, ns, brief_key="x", user_id="u2", sections={"goal": "g"})
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    r = await save(call, sess, ns, brief_key="x", session_id="s2", sections={"goal": "g"})
    assert r.status_code == 403 and r.json()["field"] == "session_id"

    # Automatic keys: a session-bounded token's session/<id> key, prefixed in storage.
    r = await save(call, sess, ns, sections={"goal": "auto"})
    assert r.json()["brief_key"] == "session/s1"
    r = await call("session.brief_get", wide, namespace=ns, brief_key="~u1~s1~session/s1")
    assert r.status_code == 200
    r = await call("session.brief_get", sess, namespace=ns, from_session="s1")
    assert r.json()["brief_key"] == "session/s1"

    # Delete: a namespace-wide writer may not delete an end-user's brief (it did not
    # write it); an admin may, by the prefix; the bounded token by its own key.
    r = await call("session.brief_delete", wide, namespace=ns, brief_key="~u1~plan")
    assert r.status_code == 403 and r.json()["rule"] == "written_by"
    r = await call("session.brief_delete", mint(ns, "admin"), namespace=ns, brief_key="~u1~plan")
    assert r.json()["deleted"] is True
    assert (await call("session.brief_get", user, namespace=ns, brief_key="plan")).status_code == 404
    r = await call("session.brief_delete", sess, namespace=ns, brief_key="plan")
    assert r.json()["deleted"] is True
    assert (await call("session.brief_get", wide, namespace=ns, brief_key="plan")).json()["sections"][
        "goal"
    ] == "wide"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"brief_key": "bad key", "sections": {"goal": "g"}}, "brief_key"),
        ({"brief_key": "~x~y", "sections": {"goal": "g"}}, "brief_key"),
        ({"brief_key": "k", "sections": {"goal": "g"}, "colour": "red"}, "colour"),
        ({"brief_key": "k", "sections": {"gaol": "g"}}, "sections.gaol"),
        ({"brief_key": "k", "events": [{"kind": "telepathy", "text": "x"}]}, "events.0.kind"),
        ({"brief_key": "k", "events": [{"kind": "note", "text": "x"}] * 4_001}, "events"),
        ({"brief_key": "k"}, "events"),
        ({"brief_key": "k", "sections": {"goal": None}}, "events"),
        ({"sections": {"goal": "g"}}, "brief_key"),
        ({"brief_key": "k", "sections": {"goal": "g"}, "if_revision": -1}, "if_revision"),
    ],
)
async def test_bad_input_is_a_4xx_naming_the_field(call, mint, ns, body, field):
    token = mint(ns, "writer")
    r = await save(call, token, ns, **body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["field"] == field
    assert (await call("session.brief_list", token, namespace=ns)).json()["briefs"] == []  # nothing written


async def test_roles(call, mint, ns):
    viewer = mint(ns, "viewer")
    r = await save(call, viewer, ns, brief_key="k", sections={"goal": "g"})
    assert r.status_code == 403
    r = await call("session.brief_delete", viewer, namespace=ns, brief_key="k")
    assert r.status_code == 403
    r = await call("session.brief_get", viewer, namespace=ns, brief_key="k")
    assert r.status_code == 404
    r = await call("session.brief_get", viewer, namespace=ns, brief_key="k", revision=0)
    assert r.status_code == 422 and r.json()["field"] == "revision"


async def test_conflict_retry_and_full_over_http(call, mint, ns):
    token = mint(ns, "writer")
    r = await save(
        call,
        token,
        ns,
        brief_key="k",
        session_id="s",
        event_cursor="e1",
        events=[
            {"kind": "user", "text": "Port the CLI to typer"},
            {"kind": "summary", "text": "Compaction summary, verbatim."},
        ],
    )
    assert r.status_code == 200 and r.json()["author"] == "deterministic" and r.json()["summary_kept"] is True
    r = await save(
        call,
        token,
        ns,
        brief_key="k",
        session_id="s",
        event_cursor="e1",
        events=[{"kind": "user", "text": "Port the CLI to typer"}],
        if_revision=0,
    )
    assert r.status_code == 200 and r.json()["changed"] is False and r.json()["reason"] == "retry"
    r = await save(call, token, ns, brief_key="k", sections={"goal": "g"}, if_revision=0)
    assert r.status_code == 409
    assert r.json() | {"message": ""} == {
        "error": "conflict",
        "message": "",
        "field": "if_revision",
        "rule": "compare_and_set",
        "current_revision": 1,
    }
    r = await call("session.brief_get", token, namespace=ns, brief_key="k", full=True)
    assert r.json()["summary"] == "Compaction summary, verbatim."
    assert r.json()["text"].endswith("Compaction summary, verbatim.\n")
    r = await save(call, token, ns, brief_key="k", use_llm=False, events=[{"kind": "note", "text": "x"}])
    assert r.json()["changed"] is False and r.json()["reason"] == "not-revised"


async def test_all_windows_failed_is_503_over_http(make_svc, mint, ns):
    svc = make_svc(llm=ScriptedLLM([LLMError("down")] * 3))
    token = mint(ns, "writer")
    async with api_over(svc) as client:
        r = await client.post(
            "/v1/session.brief_save",
            headers={"Authorization": f"Bearer {token}"},
            json={"namespace": ns, "brief_key": "k", "events": [{"kind": "note", "text": "x"}]},
        )
        assert r.status_code == 503 and r.json()["error"] == "unavailable" and r.json()["windows_failed"] == 1
        r = await client.post(
            "/v1/session.brief_get",
            headers={"Authorization": f"Bearer {token}"},
            json={"namespace": ns, "brief_key": "k"},
        )
        assert r.status_code == 404
