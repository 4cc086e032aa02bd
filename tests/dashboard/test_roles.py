"""The role matrix on the dashboard's pages: what each kind of token sees and may do,
exactly as the API allows it (a real `loom serve`, plain HTTP, no browser)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.usefixtures("arq_worker")

KINDS = ("viewer", "writer", "admin", "end_user")
ADMIN_PAGES = ("/dashboard/review", "/dashboard/settings", "/dashboard/retention", "/dashboard/health")


def _token(mint: Any, ns: str, kind: str) -> str:
    if kind == "end_user":
        return mint(ns, "writer", read_scope="own_user", read_user_id="u-1")  # type: ignore[no-any-return]
    return mint(ns, kind)  # type: ignore[no-any-return]


@pytest.fixture
async def signed_in(served: str, mint: Any, ns: str) -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    async def open_as(kind: str) -> httpx.AsyncClient:
        client = httpx.AsyncClient(base_url=served, timeout=60)
        clients.append(client)
        r = await client.post("/dashboard/signin", data={"token": _token(mint, ns, kind)})
        assert r.status_code == 303 and "loom_dashboard" in r.cookies, r.text
        return client

    yield open_as
    for c in clients:
        await c.aclose()


@pytest.fixture
async def thread(ns: str, mint: Any, call: Any) -> str:
    admin = mint(ns, "admin")
    await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    r = await call(
        "conversation.append", admin, namespace=ns, thread_id="th-roles", role="user", content="hello"
    )
    assert r.json()["stored"] is True
    return "th-roles"


@pytest.mark.parametrize("kind", KINDS)
async def test_pages_follow_the_token(kind, signed_in, ns, thread):
    client = await signed_in(kind)
    conv = await client.get("/dashboard/conversations")
    thr = await client.get(f"/dashboard/thread?agent=default&thread={thread}")
    if kind == "end_user":  # sees only its Saved panel
        assert conv.status_code == 303 and conv.headers["location"].endswith("/dashboard/saved")
        assert thr.status_code == 303
        saved = await client.get("/dashboard/saved")
        assert saved.status_code == 200 and ">Conversations<" not in saved.text
        for path in ADMIN_PAGES:
            assert (await client.get(path)).status_code == 303
        memory = await client.get("/dashboard/memory")  # its own memory, no user to name
        assert (
            memory.status_code == 200 and 'id="facts-h"' in memory.text and 'id="m-user"' not in memory.text
        )
        return
    memory = await client.get("/dashboard/memory?user=u-1")  # memory.list is the writer's
    assert memory.status_code == (403 if kind == "viewer" else 200)
    assert conv.status_code == 200 and thr.status_code == 200
    assert ('id="record-switch"' in conv.text) == (kind == "admin")
    assert 'id="record-state"' in conv.text  # everyone sees the state, honestly
    assert ('id="compact"' in thr.text) == (kind in ("writer", "admin"))
    assert ('id="delete"' in thr.text) == (kind == "admin")
    assert ("/dashboard/message/delete" in thr.text) == (kind in ("writer", "admin"))
    assert ("/dashboard/message/redact" in thr.text) == (kind == "admin")
    assert (">Settings<" in conv.text) == (kind == "admin")
    for path in ADMIN_PAGES:
        page = await client.get(path)
        assert page.status_code == (200 if kind == "admin" else 403), (path, page.status_code)
        if kind != "admin":
            assert (
                "forbidden" in page.text
                and '<form method="post" action="/dashboard/settings"' not in page.text
            )


@pytest.mark.parametrize("kind", KINDS)
async def test_changes_follow_the_token(kind, signed_in, ns, thread, call, mint):
    client = await signed_in(kind)
    flip = await client.post("/dashboard/conversations/recording", data={"ns": ns, "enabled": "false"})
    compact = await client.post(
        "/dashboard/thread/compact", data={"ns": ns, "agent": "default", "thread": thread}
    )
    delete = await client.post(
        "/dashboard/thread/delete", data={"ns": ns, "agent": "default", "thread": thread, "confirm": "nope"}
    )
    expected_flip = 303 if kind == "admin" else 403
    assert flip.status_code == expected_flip, flip.text
    # A writer may compact; this server has no LLM provider, which the page then says.
    assert compact.status_code == (409 if kind in ("writer", "admin") else 403), compact.text
    if kind in ("writer", "admin"):
        assert "provider_not_configured" in compact.text
    redact = await client.post(
        "/dashboard/message/redact", data={"ns": ns, "agent": "default", "thread": thread, "msg": "nope"}
    )
    assert redact.status_code == (404 if kind == "admin" else 403), redact.text  # admin: no such message
    # An admin's delete still needs the confirm step: a wrong one is refused naming the field.
    assert delete.status_code == (422 if kind == "admin" else 403), delete.text
    if kind == "admin":
        assert "confirm_thread_id" in delete.text
    config = await call("namespace.get_config", mint(ns, "viewer"), namespace=ns)
    assert config.json()["conversation_logging_enabled"] is (kind != "admin")


async def test_a_cross_site_post_is_refused(signed_in, ns, thread, served):
    client = await signed_in("admin")
    r = await client.post(
        "/dashboard/conversations/recording",
        data={"ns": ns, "enabled": "false"},
        headers={"origin": "http://evil.example"},
    )
    assert r.status_code == 403 and r.json()["rule"] == "same_origin"


async def test_pages_carry_no_inline_script_and_a_strict_policy(signed_in):
    client = await signed_in("admin")
    r = await client.get("/dashboard/conversations")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert "<script>" not in r.text and "onclick" not in r.text
    assert r.headers["cache-control"] == "no-store"


async def test_a_namespace_the_token_lacks_is_never_shown(signed_in, mint, ns, call):
    other = f"{ns}x"
    await call("conversation.set_logging", mint(other, "admin"), namespace=other, enabled=True)
    client = await signed_in("admin")
    r = await client.get(f"/dashboard/conversations?ns={other}")
    assert r.status_code == 200 and other not in r.text.replace(ns, "")  # falls back to its own


async def test_threads_page_through_every_agent_newest_first(signed_in, mint, ns, call):
    admin = mint(ns, "admin")
    await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    turns = [{"thread_id": f"th-{i:02d}", "role": "user", "content": f"turn number {i}"} for i in range(27)]
    r = await call("conversation.append", admin, namespace=ns, turns=turns)
    assert r.json()["stored"] == 27
    other = await call(
        "conversation.append",
        admin,
        namespace=ns,
        agent="helper",
        thread_id="th-helper",
        role="user",
        content="by another agent",
    )
    assert other.json()["stored"] is True
    client = await signed_in("viewer")
    first = await client.get("/dashboard/conversations")
    rows = first.text.count("/dashboard/thread?")
    assert (
        rows == 25 and "th-helper" in first.text and ">Older<" in first.text and ">Newer<" not in first.text
    )
    second = await client.get("/dashboard/conversations", params={"offset": 25})
    assert (
        second.text.count("/dashboard/thread?") == 3
        and ">Newer<" in second.text
        and ">Older<" not in second.text
    )
