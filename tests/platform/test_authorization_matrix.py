"""Who may do what, tried exhaustively: every op of the OpenAPI listing and every tool of
the MCP listings, under every kind of token, on the caller's own data and on another
user's, over seeded users whose every stored text carries a sentinel of its own.

Each answer's status is checked against loom.auth.policy (the one table), and no
answer (HTTP body or error, MCP tool result, SDK return value, dashboard page, webhook
payload) ever holds another user's sentinel, or a transcript turn no user owns, for a
token bound to one user or session, nor another namespace's sentinel for any token.

A new op fails here until it has a request body in BODIES (and its policy entry, or the
app does not start)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest

from loom.auth import policy
from loom.auth import tokens as token_ops
from loom.auth.principal import Principal, Role
from loom.mcp_server.tools import SPECS
from loom.sdk.transport import LoomError, Retry, Transport
from tests.integrations.test_mcp import over_http
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.timeout(600)

RUN = secrets.token_hex(4)
ALICE = f"alice{RUN}sentinel"  # every text of alice's
BOB = f"bob{RUN}sentinel"  # every text of bob's
UNOWNED = f"unowned{RUN}sentinel"  # transcript turns no user owns, a namespace-wide brief
ELSEWHERE = f"elsewhere{RUN}sentinel"  # every text of the other namespace
SESSION = "s1"
THREAD = "t-seeded"


@dataclass(frozen=True)
class Kind:
    """One kind of token: how it is minted (None: it verifies as nobody) and the principal
    the table is read for."""

    name: str
    role: str = "admin"
    scope: str = "all"
    elsewhere: bool = False  # granted only the other namespace
    unusable: str = ""  # revoked | expired | malformed

    @property
    def bounded(self) -> bool:
        return self.scope != "all"

    def principal(self, ns: str, other: str) -> Principal:
        user = "alice" if self.bounded else ""
        session = SESSION if self.scope == "own_session" else ""
        return Principal("t", (other if self.elsewhere else ns,), Role[self.role], self.scope, user, session)


KINDS = (
    Kind("admin"),
    Kind("writer", role="writer"),
    Kind("viewer", role="viewer"),
    Kind("own_user", role="writer", scope="own_user"),
    Kind("own_session", role="writer", scope="own_session"),
    Kind("elsewhere_admin", elsewhere=True),
    Kind("revoked", unusable="revoked"),
    Kind("expired", unusable="expired"),
    Kind("malformed", unusable="malformed"),
)


def _body(ns: str, subject: str) -> dict[str, dict[str, Any]]:
    """Every op's request for `subject`'s data ("alice": the bounded tokens' own user;
    "bob": another user). Writes touch throwaway rows; removals name rows that do not
    exist, so the order of the cases does not matter."""
    u = {"namespace": ns, "user_id": subject}
    throwaway = f"t-matrix-{subject}"
    return {
        "context.pack": {**u, "thread_id": THREAD, "query": "ferry", "session_id": SESSION},
        "conversation.append": {"namespace": ns, "thread_id": throwaway, "role": "user", "content": "hi"},
        "conversation.compact": {"namespace": ns, "thread_id": throwaway},
        "conversation.compact_status": {"namespace": ns, "job_id": "no-such-job"},
        "conversation.create": {"namespace": ns, "thread_id": throwaway, "title": "matrix"},
        "conversation.delete": {"namespace": ns, "thread_id": "t-none", "confirm_thread_id": "t-none"},
        "conversation.delete_message": {"namespace": ns, "thread_id": THREAD, "msg_id": f"{subject}-none"},
        "conversation.get": {"namespace": ns, "thread_id": THREAD, "include_messages": True},
        "conversation.high_turns": {"namespace": ns},
        "conversation.list": {"namespace": ns, "thread_id": THREAD},
        "conversation.list_saved_messages": u,
        "conversation.redact": {"namespace": ns, "thread_id": THREAD, "msg_id": "none", "high": True},
        "conversation.reembed": {"namespace": ns, "thread_id": "t-none"},
        "conversation.save_message": {**u, "conversation_id": THREAD, "message_id": f"{subject}-said"},
        "conversation.saved_status": {
            **u,
            "conversation_id": THREAD,
            "message_ids": ["alice-said", "bob-said"],
        },
        "conversation.search": {"namespace": ns, "query": "ferry timetable"},
        "conversation.search_saved_messages": {**u, "query": "ferry timetable"},
        "conversation.set_logging": {"namespace": ns, "enabled": True},
        "conversation.threads": {"namespace": ns},
        "conversation.unsave_message": {**u, "conversation_id": THREAD, "message_id": "none"},
        "conversation.update": {"namespace": ns, "thread_id": throwaway, "title": "matrix"},
        "erasure.export": {"user_id": subject},
        "erasure.request": {"user_id": f"{subject}-never-seen"},
        "erasure.status": {"erasure_id": "no-such-erasure"},
        "health.show": {},
        "memory.ask": {**u, "question": "what about the ferry?"},
        "memory.delete": {**u, "memory_ids": ["m-none"]},
        "memory.history": {**u, "memory_id": "m-none"},
        "memory.job_status": {"namespace": ns, "job_id": "no-such-job"},
        "memory.list": u,
        "memory.profile": u,
        "memory.recall": {**u, "query": "ferry"},
        "memory.search": {**u, "query": "ferry timetable"},
        "memory.set": {**u, "facts": [{"text": "likes matrices"}]},
        "memory.set_from_messages": {**u, "messages": [{"role": "user", "content": "hello there"}]},
        "namespace.get_config": {"namespace": ns},
        "namespace.set_policy": {"namespace": ns, "model_calls_enabled": True},
        "observe.crystallize": {**u, "run_id": "r-none"},
        "observe.record": {**u, "run_id": "r-matrix", "tool": "grep"},
        "replicas.show": {},
        "retention.show": {},
        "search": {**u, "query": "ferry timetable"},
        "session.brief_delete": {"namespace": ns, "brief_key": f"none-{subject}"},
        "session.brief_get": {"namespace": ns, "brief_key": "plan"},
        "session.brief_list": {"namespace": ns},
        "session.brief_save": {**u, "brief_key": f"matrix-{subject}", "sections": {"goal": "g"}},
        "settings.get": {},
        "settings.set": {"values": {"LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS": None}},
        "webhook.delete": {"namespace": ns, "webhook_id": "wh-none"},
        "webhook.deliveries": {"namespace": ns},
        "webhook.list": {"namespace": ns},
        "webhook.register": {"namespace": ns, "url": "http://127.0.0.1:9/none"},
        "webhook.rotate_secret": {"namespace": ns},
    }


def _names_another_user(body: dict[str, Any]) -> bool:
    return body.get("user_id") == "bob"


def expected(op: str, kind: Kind, body: dict[str, Any], ns: str, other: str) -> int | None:
    """401 or 403 where the table refuses the call; None where it allows it."""
    if kind.unusable:
        return 401
    if kind.elsewhere and body.get("namespace") == ns:
        return 403
    if not policy.rule_for(op).allows(kind.principal(ns, other)):
        return 403
    if kind.bounded and _names_another_user(body):
        return 403
    return None


def forbidden_sentinels(kind: Kind) -> tuple[str, ...]:
    if kind.elsewhere:
        return (ALICE, BOB, UNOWNED)
    if kind.bounded:
        return (BOB, UNOWNED, ELSEWHERE)
    return (ELSEWHERE,)


def assert_no_leak(kind: Kind, where: str, text: str) -> None:
    leaked = [s for s in forbidden_sentinels(kind) if s in text]
    assert not leaked, f"{where}: a {kind.name} token's answer holds {leaked}"


@dataclass
class Seeded:
    ns: str
    other: str
    tokens: dict[str, str]
    receiver: Receiver


async def _ok(call: Callable[..., Awaitable[httpx.Response]], op: str, token: str, **body: Any) -> Any:
    r = await call(op, token, **body)
    assert r.status_code == 200, (op, r.text)
    return r.json()


async def _seed_namespace(call: Any, mint: Any, ns: str, words: dict[str, str]) -> None:
    """Turns, saved messages, facts, evidence and briefs, each text holding its owner's sentinel."""
    admin = mint(ns, "admin")
    await _ok(call, "conversation.set_logging", admin, namespace=ns, enabled=True)
    turns = [
        {
            "msg_id": "alice-said",
            "role": "user",
            "user_id": "alice",
            "content": f"{words['alice']} ferry timetable",
        },
        {
            "msg_id": "to-bob",
            "role": "assistant",
            "user_id": "bob",
            "content": f"{words['bob']} ferry to bob",
        },
        {
            "msg_id": "bob-said",
            "role": "user",
            "user_id": "bob",
            "content": f"{words['bob']} ferry timetable too",
        },
        {"msg_id": "nobodys", "role": "user", "content": f"{words['unowned']} ferry timetable for all"},
        {
            "msg_id": "nobodys-reply",
            "role": "assistant",
            "content": f"{words['unowned']} the ferry leaves at 9",
        },
    ]
    turns = [{**t, "thread_id": THREAD} for t in turns]
    await _ok(call, "conversation.append", admin, namespace=ns, turns=turns)
    for user in ("alice", "bob"):
        msg = f"{user}-said"
        await _ok(
            call,
            "conversation.save_message",
            admin,
            namespace=ns,
            user_id=user,
            conversation_id=THREAD,
            message_id=msg,
        )
        text = f"{words[user]} ferry timetable fact"
        await _ok(call, "memory.set", admin, namespace=ns, user_id=user, facts=[{"text": text}])
        await _ok(
            call,
            "memory.set",
            admin,
            namespace=ns,
            user_id=user,
            session_id=SESSION,
            facts=[{"text": f"{words[user]} session fact about the ferry"}],
        )
        await _ok(
            call,
            "memory.set_from_messages",
            admin,
            namespace=ns,
            user_id=user,
            messages=[{"role": "user", "content": f"{words[user]} ferry evidence"}],
        )
        bounded = mint(ns, "writer", read_scope="own_user", read_user_id=user)
        await _ok(
            call,
            "session.brief_save",
            bounded,
            namespace=ns,
            brief_key="plan",
            sections={"goal": words[user]},
        )
    await _ok(
        call, "session.brief_save", admin, namespace=ns, brief_key="team", sections={"goal": words["unowned"]}
    )


@pytest.fixture
async def seeded(call: Any, mint: Any, services: Any, arq_worker: Any) -> Any:
    ns, other = f"m{secrets.token_hex(5)}", f"m{secrets.token_hex(5)}"
    await _seed_namespace(call, mint, ns, {"alice": ALICE, "bob": BOB, "unowned": UNOWNED})
    everything_else = {"alice": ELSEWHERE, "bob": ELSEWHERE, "unowned": ELSEWHERE}
    await _seed_namespace(call, mint, other, everything_else)
    tokens = {
        "admin": mint(ns, "admin"),
        "writer": mint(ns, "writer"),
        "viewer": mint(ns, "viewer"),
        "own_user": mint(ns, "writer", read_scope="own_user", read_user_id="alice"),
        "own_session": mint(
            ns, "writer", read_scope="own_session", read_user_id="alice", read_session_id=SESSION
        ),
        "elsewhere_admin": mint(other, "admin"),
        "malformed": "loom_nothing_like_a_token",
    }
    revoked = token_ops.mint(services.ch, [ns], "admin")
    token_ops.revoke(services.ch, revoked.token_id)
    tokens["revoked"] = revoked.token
    tokens["expired"] = token_ops.mint(services.ch, [ns], "admin", expires_in=timedelta(milliseconds=1)).token
    with Receiver() as receiver:
        await _ok(call, "webhook.register", tokens["admin"], namespace=ns, url=receiver.url)
        yield Seeded(ns, other, tokens, receiver)


def _openapi_ops(app_openapi: dict[str, Any]) -> list[str]:
    return sorted(p.removeprefix("/v1/") for p in app_openapi["paths"] if p.startswith("/v1/"))


async def test_every_op_under_every_token_kind_holds_the_table_and_leaks_nothing(
    seeded: Seeded, call: Any, api: httpx.AsyncClient, api_url: str
) -> None:
    ns, other = seeded.ns, seeded.other
    ops = _openapi_ops((await api.get("/openapi.json")).json())
    missing = sorted(set(ops) - set(_body(ns, "alice")))
    assert not missing, f"no request body in BODIES for {missing}: add one"
    assert set(ops) == set(policy.POLICY)
    cases = 0
    for subject in ("alice", "bob"):
        bodies = _body(ns, subject)
        for kind in KINDS:
            token = seeded.tokens[kind.name]
            for op in ops:
                r = await call(op, token, **bodies[op])
                want = expected(op, kind, bodies[op], ns, other)
                where = f"{op} as {kind.name} on {subject}'s data"
                if want is None:
                    assert r.status_code not in (401, 403) and r.status_code < 500, (where, r.text)
                else:
                    assert r.status_code == want, (where, r.text)
                assert_no_leak(kind, where, r.text)
                cases += 1
    # The bounded tokens' own data comes through where the table lets it.
    r = await call("memory.search", seeded.tokens["own_user"], namespace="@me", query="ferry timetable")
    assert ALICE in r.text
    sdk = await _through_the_sdk(seeded, api_url)
    mcp = await _through_mcp(seeded, api_url)
    pages = await _through_the_dashboard(seeded, api)
    delivered = await _webhook_payloads(seeded)
    print(
        f"\nauthorization matrix: {cases} HTTP cases, {sdk} SDK, {mcp} MCP, {pages} dashboard pages, "
        f"{delivered} webhook payloads"
    )


async def _through_the_sdk(seeded: Seeded, api_url: str) -> int:
    """The bounded tokens' answers as the Python SDK returns them."""
    n = 0
    for kind in (k for k in KINDS if k.bounded):
        transport = Transport(api_url, seeded.tokens[kind.name], retry=Retry(attempts=1))
        try:
            for subject in ("alice", "bob"):
                for op, body in _body(seeded.ns, subject).items():
                    try:
                        answer: Any = await transport.call(op, body, idempotent=False)
                        text = json.dumps(answer)
                    except LoomError as exc:
                        text = json.dumps(exc.__dict__, default=str)
                    assert_no_leak(kind, f"SDK {op}", text)
                    n += 1
        finally:
            await transport.aclose()
    return n


async def _through_mcp(seeded: Seeded, api_url: str) -> int:
    """Every tool of the `all` listing, as each usable token; an unusable one cannot open a session."""
    ns, other = seeded.ns, seeded.other
    n = 0
    for kind in KINDS:
        token = seeded.tokens[kind.name]
        if kind.unusable:
            r = httpx.post(f"{api_url}/mcp", headers={"Authorization": f"Bearer {token}"}, json={})
            assert r.status_code == 401
            n += 1
            continue
        async with over_http(api_url, token, "all") as mcp:
            listed = {t.name for t in (await mcp.list_tools()).tools}
            for spec in SPECS:
                allowed = policy.rule_for(spec.op).allows(kind.principal(ns, other))
                assert (spec.name in listed) == allowed, (spec.name, kind.name)
                for subject in ("alice", "bob"):
                    body = _body(ns, subject)[spec.op]
                    result = await mcp.call_tool(spec.name, body)
                    text = result.content[0].text if result.content else ""
                    refused = result.isError and json.loads(text).get("error") in (
                        "forbidden",
                        "unauthorized",
                    )
                    want = expected(spec.op, kind, body, ns, other)
                    assert refused == (want is not None), (spec.name, kind.name, subject, text)
                    assert_no_leak(kind, f"MCP {spec.name}", text)
                    n += 1
    return n


PAGES = (
    "/dashboard/",
    "/dashboard/conversations",
    f"/dashboard/thread?thread_id={THREAD}&agent=default",
    "/dashboard/saved",
    "/dashboard/saved?user_id=bob",
    "/dashboard/saved/results?q=ferry+timetable",
    "/dashboard/saved/results?q=ferry+timetable&user_id=bob",
    "/dashboard/brief?key=plan",
    "/dashboard/settings",
    "/dashboard/retention",
    "/dashboard/health",
    "/dashboard/review",
)


async def _through_the_dashboard(seeded: Seeded, api: httpx.AsyncClient) -> int:
    n = 0
    for kind in KINDS:
        cookies = {"loom_dashboard": seeded.tokens[kind.name]}
        for page in PAGES:
            url = page + ("&" if "?" in page else "?") + f"ns={seeded.ns}"
            r = await api.get(url, cookies=cookies, follow_redirects=True)
            assert r.status_code < 500, (url, kind.name, r.status_code)
            assert_no_leak(kind, f"dashboard {page}", r.text)
            n += 1
    return n


async def _webhook_payloads(seeded: Seeded) -> int:
    """The erasure the admin asked for was announced; no payload holds any text."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not seeded.receiver.received:
        await asyncio.sleep(0.2)
    assert seeded.receiver.received, "no webhook delivery arrived"
    for got in seeded.receiver.received:
        body = got.body.decode()
        for sentinel in (ALICE, BOB, UNOWNED, ELSEWHERE):
            assert sentinel not in body
    return len(seeded.receiver.received)
