"""Roles and scopes of the saved-message ops: the matrix of six ops (the five saved-
message ops and conversation.list, which stays refused to tokens pinned to one user)
by every kind of token."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conversation.helpers import emb_rows, turn_rows

OPS: dict[str, dict[str, Any]] = {
    "conversation.save_message": dict(
        conversation_id="c", message_id="m", role="user", content="hello there"
    ),
    "conversation.unsave_message": dict(conversation_id="c", message_id="m"),
    "conversation.list_saved_messages": {},
    "conversation.saved_status": dict(conversation_id="c", message_ids=["m"]),
    "conversation.search_saved_messages": dict(query="hello"),
    "conversation.list": dict(thread_id="c"),
}
WRITES = {"conversation.save_message", "conversation.unsave_message"}
SAVED_OPS = set(OPS) - {"conversation.list"}

# kind -> (role, read_scope, extra mint args, namespace in the body, user_id in the body)
KINDS: dict[str, tuple[str, str, dict[str, str], str, str | None]] = {
    "admin": ("admin", "all", {}, "{ns}", "alice"),
    "writer": ("writer", "all", {}, "{ns}", "alice"),
    "viewer": ("viewer", "all", {}, "{ns}", "alice"),
    "own_user": ("writer", "own_user", {"read_user_id": "alice"}, "@me", None),
    "own_user_viewer": ("viewer", "own_user", {"read_user_id": "alice"}, "@me", None),
    "own_session": ("admin", "own_session", {"read_session_id": "s1"}, "@me", None),
    "wrong_namespace": ("admin", "all", {}, "{ns}x", "alice"),
    "no_token": ("", "", {}, "{ns}", "alice"),
}


def expected(kind: str, op: str) -> tuple[int, str | None, str | None]:
    """(status, rule, field) the op answers to this kind of token."""
    if kind == "no_token":
        return 401, None, None
    if kind == "own_session":
        return 403, "read_scope", None
    if kind.startswith("own_user") and op not in SAVED_OPS:
        return 403, "read_scope", None
    if kind in ("viewer", "own_user_viewer") and op in WRITES:
        return 403, "role", None
    if kind == "wrong_namespace":
        return 403, "scope", "namespace"
    return 200, None, None


@pytest.mark.parametrize("kind", list(KINDS))
async def test_auth_matrix(call, ns, mint, recording, services, kind):
    recording(ns, True)
    role, scope, extra, namespace, user = KINDS[kind]
    token = None if kind == "no_token" else mint(ns, role, read_scope=scope, **extra)
    for op, body in OPS.items():
        payload = {**body, "namespace": namespace.format(ns=ns)}
        if user is not None and op in SAVED_OPS:
            payload["user_id"] = user
        r = await call(op, token, **payload)
        status, rule, field = expected(kind, op)
        assert r.status_code == status, (kind, op, r.text)
        if rule is not None:
            assert r.json()["rule"] == rule, (kind, op, r.text)
        if field is not None:
            assert r.json()["field"] == field, (kind, op, r.text)
    if expected(kind, "conversation.save_message")[0] != 200:
        assert turn_rows(services.ch, ns) == [] and emb_rows(services.ch, ns) == []


async def test_own_user_token_is_bound_to_its_user_on_every_op(call, ns, mint, services):
    writer = mint(ns, "writer")
    pinned = mint(ns, "writer", read_scope="own_user", read_user_id="alice")
    for user in ("alice", "bob"):
        r = await call(
            "conversation.save_message",
            writer,
            namespace=ns,
            user_id=user,
            conversation_id="c",
            message_id=f"m-{user}",
            role="user",
            content=f"note of {user} about otters",
        )
        assert r.status_code == 200 and r.json()["saved"], r.text
    for op, body in OPS.items():
        if op == "conversation.list":
            continue
        r = await call(op, pinned, namespace="@me", user_id="bob", **body)
        assert r.status_code == 403 and r.json()["field"] == "user_id" and r.json()["rule"] == "own_user", (
            op,
            r.text,
        )
    # Without user_id (or naming itself) it sees only its own user's.
    r = await call("conversation.list_saved_messages", pinned, namespace="@me")
    assert [m["message_id"] for m in r.json()["messages"]] == ["m-alice"]
    r = await call(
        "conversation.search_saved_messages",
        pinned,
        namespace=ns,
        user_id="alice",
        query="otters",
        search_mode="lexical",
    )
    assert [h["message_id"] for h in r.json()["hits"]] == ["m-alice"]
    r = await call(
        "conversation.saved_status",
        pinned,
        namespace="@me",
        conversation_id="c",
        message_ids=["m-alice", "m-bob"],
    )
    assert r.json()["saved"] == {"m-alice": True, "m-bob": False}
    r = await call(
        "conversation.unsave_message", pinned, namespace="@me", conversation_id="c", message_id="m-bob"
    )
    assert r.json() == {"found": False, "removed": False}
    assert [x["msg_id"] for x in turn_rows(services.ch, ns) if x["is_saved"]] == ["m-alice", "m-bob"]


async def test_at_me_needs_a_pinned_token_with_one_namespace(call, ns, mint):
    r = await call("conversation.list_saved_messages", mint(ns, "viewer"), namespace="@me", user_id="alice")
    assert r.status_code == 403 and r.json()["field"] == "namespace"
    two = mint([ns, ns + "b"], "viewer", read_scope="own_user", read_user_id="alice")
    r = await call("conversation.list_saved_messages", two, namespace="@me")
    assert r.status_code == 403 and r.json()["field"] == "namespace"
    r = await call("conversation.list_saved_messages", two, namespace=ns + "b")
    assert r.status_code == 200
