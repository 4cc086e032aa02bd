"""Loom's MCP server through the official `mcp` SDK's own client: streamable HTTP at
`/mcp` on the API (a real port) and `loom mcp` over stdio (a subprocess calling that
API), both listings, tool calls, the API's refusals, and the sessions' implicit runs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from loom import logging as loom_logging
from loom.mcp_server.server import Runs, with_run
from loom.mcp_server.tools import SPECS, find, listed

CORE = {
    "loom_search",
    "loom_memory_search",
    "loom_memory_set",
    "loom_memory_list",
    "loom_memory_delete",
    "loom_context_pack",
    "loom_session_brief_save",
    "loom_session_brief_get",
    "loom_session_brief_list",
}


@asynccontextmanager
async def over_http(api_url: str, token: str, toolset: str = "") -> AsyncIterator[ClientSession]:
    url = f"{api_url}/mcp" + (f"?toolset={toolset}" if toolset else "")
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=120) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(api_url: str, token: str, *args: str, **env: str) -> AsyncIterator[ClientSession]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    environ |= {"LOOM_URL": api_url, "LOOM_TOKEN": token, **env}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "loom.cli.main", "mcp", *args], env=environ
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _answer(result: Any) -> dict[str, Any]:
    return json.loads(result.content[0].text)  # type: ignore[no-any-return]


async def _record(call: Any, ns: str, token: str) -> None:
    r = await call("conversation.set_logging", token, namespace=ns, enabled=True)
    assert r.status_code == 200, r.text


@contextmanager
def console(verbose: bool) -> Iterator[io.StringIO]:
    """What `loom serve`'s console would show (loom.logging's handler), meanwhile."""
    out = io.StringIO()
    handler = loom_logging.console_handler(verbose, out)
    logging.getLogger().addHandler(handler)
    try:
        yield out
    finally:
        logging.getLogger().removeHandler(handler)


async def test_the_core_listing_has_no_append_and_asks_no_model_to_log(api_url, arq_worker, ns, mint) -> None:
    with console(verbose=False) as quiet, console(verbose=True) as verbose:
        async with over_http(api_url, mint(ns, "writer")) as mcp:
            tools = (await mcp.list_tools()).tools
        # The client closed its session: one debug line when verbose, nothing otherwise.
        for _ in range(100):
            if "the client closed its stream" in verbose.getvalue():
                break
            await asyncio.sleep(0.05)
    closed = [line for line in verbose.getvalue().splitlines() if "closed its stream" in line]
    assert len(closed) == 1 and " DEBUG mcp." in closed[0], verbose.getvalue()
    assert "Traceback" not in verbose.getvalue() and "mcp." not in quiet.getvalue(), quiet.getvalue()
    assert {t.name for t in tools} == CORE
    for t in tools:
        words = (t.description or "").lower()
        assert not any(w in words for w in ("log ", "append", "record every", "after each")), t
    async with over_http(api_url, mint(ns, "admin"), "all") as mcp:
        every = {t.name for t in (await mcp.list_tools()).tools}
    assert every == {s.name for s in SPECS} and "loom_conversation_append" in every
    # conversation.search is hidden from MCP: agents get the conversation section of loom_search.
    assert "loom_conversation_search" not in every and all(s.op != "conversation.search" for s in SPECS)


async def test_a_listing_holds_only_what_the_token_may_call(api_url, arq_worker, ns, mint) -> None:
    async with over_http(api_url, mint(ns, "viewer")) as mcp:
        viewer_core = {t.name for t in (await mcp.list_tools()).tools}
    assert viewer_core == CORE - {
        "loom_memory_set",
        "loom_memory_list",
        "loom_memory_delete",
        "loom_session_brief_save",
    }
    end_user = mint(ns, "writer", read_scope="own_user", read_user_id="alice")
    async with over_http(api_url, end_user, "all") as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
    assert "loom_conversation_save_message" in names and "loom_memory_set" in names
    assert not {"loom_conversation_append", "loom_conversation_list", "loom_conversation_get"} & names
    assert "loom_erasure_request" not in names


async def test_calls_over_http_answer_as_the_api_and_writes_join_the_sessions_run(
    api_url, arq_worker, call, ns, mint
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    async with over_http(api_url, admin, "all") as mcp:
        turn = {"namespace": ns, "thread_id": "t", "role": "user", "content": "invoices go to the new ledger"}
        appended = await mcp.call_tool("loom_conversation_append", turn)
        assert not appended.isError and _answer(appended)["stored"] is True
        fact = {"namespace": ns, "user_id": "u1", "facts": [{"text": "Prefers EUR invoices"}]}
        assert not (await mcp.call_tool("loom_memory_set", fact)).isError
        found = await mcp.call_tool("loom_search", {"namespace": ns, "user_id": "u1", "query": "invoices"})
        assert not found.isError and found.structuredContent is not None
        bad = await mcp.call_tool(
            "loom_memory_search", {"namespace": ns, "user_id": "u1", "query": "x", "limit": 0}
        )
        assert bad.isError and _answer(bad)["field"] == "limit"
    listed_turns = await call("conversation.list", admin, namespace=ns, thread_id="t")
    facts = await call("memory.list", admin, namespace=ns, user_id="u1")
    run = listed_turns.json()["messages"][0]["run_id"]
    assert run.startswith("mcp-") and facts.json()["facts"][0]["run_id"] == run  # one session, one run


async def test_tokens_roles_and_scopes_hold(api_url, arq_worker, ns, mint) -> None:
    r = httpx.post(f"{api_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = httpx.post(
        f"{api_url}/mcp?toolset=every", headers={"Authorization": f"Bearer {mint(ns, 'viewer')}"}, json={}
    )
    assert r.status_code == 422 and r.json()["field"] == "toolset"
    async with over_http(api_url, mint(ns, "viewer")) as mcp:
        refused = await mcp.call_tool(
            "loom_memory_set", {"namespace": ns, "user_id": "u", "facts": [{"text": "x"}]}
        )
        assert refused.isError and _answer(refused)["error"] == "forbidden"
        other = await mcp.call_tool(
            "loom_memory_search", {"namespace": "elsewhere", "user_id": "u", "query": "x"}
        )
        assert other.isError and _answer(other)["error"] == "forbidden"
        hidden = await mcp.call_tool("loom_conversation_append", {"namespace": ns})
        assert hidden.isError and _answer(hidden)["error"] == "not_found"


async def test_stdio_lists_both_toolsets_calls_and_closes_an_idle_run(
    api_url, arq_worker, call, ns, mint
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    async with over_stdio(api_url, admin) as mcp:
        assert {t.name for t in (await mcp.list_tools()).tools} == CORE
        assert not (await mcp.call_tool("loom_search", {"namespace": ns, "query": "ledger"})).isError
    async with over_stdio(api_url, admin, "--toolset", "all", LOOM_MCP_SESSION_RUN_IDLE_SECONDS="1") as mcp:
        assert "loom_conversation_append" in {t.name for t in (await mcp.list_tools()).tools}
        for n in range(3):
            turn = {
                "namespace": ns,
                "thread_id": "s",
                "msg_id": f"m{n}",
                "role": "user",
                "content": f"turn {n}",
            }
            assert not (await mcp.call_tool("loom_conversation_append", turn)).isError
            await asyncio.sleep(0.1 if n == 0 else 1.5)  # idle past the setting after the second
    runs = [
        m["run_id"]
        for m in (await call("conversation.list", admin, namespace=ns, thread_id="s")).json()["messages"]
    ]
    assert runs[0] == runs[1] != runs[2] and all(r.startswith("mcp-") for r in runs)


def test_runs_and_what_joins_them() -> None:
    runs = Runs(idle_s=60)
    first = runs.current("a")
    assert runs.current("a") == first != runs.current("b")
    append = find("all", "loom_conversation_append")
    assert append is not None and find("core", "loom_conversation_append") is None
    batch = with_run(append, {"turns": [{"content": "x"}, {"content": "y", "run_id": "mine"}]}, "r1")
    assert [t["run_id"] for t in batch["turns"]] == ["r1", "mine"]
    assert with_run(append, {"content": "x"}, "r1")["run_id"] == "r1"
    assert all(t.core for t in listed("core"))
