"""Every setting of the conversation plane's table is live (settings.get / settings.set):
retention and tiering land on the tables' TTL at once (a shorter retention only when
confirmed), the Context and Mcp settings are in force without a restart, every change is
audited, and no secret is ever listed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.ops.platform import live_settings
from loom.ops.platform import settings as ops
from loom.store.schema import prepare

RETENTION = "LOOM_RETENTION_CONVERSATIONS_DAYS"
WARM = "LOOM_TIERING_CONVERSATIONS_WARM_DAYS"
SEED_TABLE = {
    "LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY": "Conversations",
    "LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS": "Conversations",
    "LOOM_CONVERSATION_TITLER_ENABLED": "Conversations",
    "LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS": "Conversations",
    "LOOM_CONVERSATION_TITLER_WINDOW_HOURS": "Conversations",
    "LOOM_CONVERSATION_TITLER_MIN_TURNS": "Conversations",
    "LOOM_CONVERSATION_TITLER_MAX_THREADS_PER_PASS": "Conversations",
    RETENTION: "Retention and storage tiering",
    WARM: "Retention and storage tiering",
    "LOOM_SESSION_BRIEF_LLM": "Context",
    "LOOM_SESSION_BRIEF_LLM_MODEL": "Context",
    "LOOM_SESSION_BRIEF_WINDOW_CHARS": "Context",
    "LOOM_SESSION_BRIEF_MAX_WINDOWS": "Context",
    "LOOM_MCP_SESSION_RUN_IDLE_SECONDS": "Mcp",
}
ALL = [live_settings.env_name(f) for f in live_settings.LIVE_SETTINGS]
ADMIN = Principal("operator-test", ("x",), Role.admin)


@pytest.fixture(autouse=True)
async def _no_overrides_left(services: Any) -> AsyncIterator[None]:
    await ops.update(services, ADMIN, dict.fromkeys(ALL))
    yield
    await ops.update(services, ADMIN, dict.fromkeys(ALL))


def _ttl(services: Any) -> str:
    row = services.ch.query(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = 'conversations'"
    ).result_rows[0][0]
    # The TTL clause as the server keeps it (a delete is its default action: not spelled).
    return str(row).split(" TTL ", 1)[1].split(" SETTINGS ", 1)[0] if " TTL " in str(row) else ""


async def test_every_setting_of_the_table_is_listed_live_and_no_secret_is(call, mint, ns):
    r = await call("settings.get", mint(ns, "admin"))
    assert r.status_code == 200
    listed = {s["name"]: s["group"] for s in r.json()["settings"]}
    assert listed == SEED_TABLE
    assert not [n for n in listed if n.endswith(("_API_KEY", "_PASSWORD", "_URL", "_USER"))]
    assert "api_key" not in r.text.lower() and "password" not in r.text.lower()


async def test_a_shorter_retention_must_be_confirmed_then_lands_on_the_ttl(call, mint, ns, services):
    admin = mint(ns, "admin")
    assert _ttl(services) == ""
    refused = await call("settings.set", admin, values={RETENTION: 30})
    assert refused.status_code == 422
    assert (refused.json()["field"], refused.json()["rule"]) == (
        "confirm_shorter_retention",
        "required_to_shorten_retention",
    )
    assert _ttl(services) == ""  # nothing written
    done = await call("settings.set", admin, values={RETENTION: 30}, confirm_shorter_retention=True)
    assert done.status_code == 200, done.text
    assert _ttl(services) == "toDateTime(ts) + toIntervalDay(30)"
    shown = (await call("retention.show", admin)).json()
    assert shown["retention_days"] == 30  # what every op (search's expiry too) now reads
    longer = await call("settings.set", admin, values={RETENTION: 60})  # keeping more needs no confirm
    assert longer.status_code == 200 and "toIntervalDay(60)" in _ttl(services)
    # A restart applies the stored override, not the environment's 0.
    prepare(
        services.settings.model_copy(update={"retention_conversations_days": 0}),
        services.settings.clickhouse_url,
    )
    assert "toIntervalDay(60)" in _ttl(services)
    cleared = await call("settings.set", admin, values={RETENTION: None})
    assert cleared.status_code == 200 and _ttl(services) == ""


async def test_every_change_is_audited_who_what_when_from_which_value(call, mint, ns, services):
    admin = mint(ns, "admin")
    who = (await call("settings.get", admin)).json()
    await call(
        "settings.set",
        admin,
        values={"LOOM_SESSION_BRIEF_WINDOW_CHARS": 5000, "LOOM_SESSION_BRIEF_LLM_MODEL": "m-2"},
    )
    await call("settings.set", admin, values={"LOOM_SESSION_BRIEF_WINDOW_CHARS": 6000})
    body = (await call("settings.get", admin)).json()
    mine = [
        c
        for c in body["changes"]
        if c["name"] in ("LOOM_SESSION_BRIEF_WINDOW_CHARS", "LOOM_SESSION_BRIEF_LLM_MODEL")
    ]
    # Newest first; one change's settings by name.
    assert [(c["name"], c["old_value"], c["new_value"]) for c in mine[:3]] == [
        ("LOOM_SESSION_BRIEF_WINDOW_CHARS", 5000, 6000),
        ("LOOM_SESSION_BRIEF_LLM_MODEL", "", "m-2"),
        ("LOOM_SESSION_BRIEF_WINDOW_CHARS", 24000, 5000),
    ]
    token_ids = {c["changed_by"] for c in mine}
    assert len(token_ids) == 1 and token_ids != {""}
    assert who["changes"] is not None
    # In force in this process at once: the brief builder and the MCP endpoint read it per call.
    assert services.settings.session_brief_window_chars == 6000
    assert services.settings.session_brief_llm_model == "m-2"


async def test_a_bad_context_value_is_refused_naming_it(call, mint, ns):
    admin = mint(ns, "admin")
    r = await call("settings.set", admin, values={"LOOM_SESSION_BRIEF_MAX_WINDOWS": 65})
    assert r.status_code == 422 and r.json()["field"] == "values.LOOM_SESSION_BRIEF_MAX_WINDOWS"
    r = await call("settings.set", admin, values={"LOOM_MCP_SESSION_RUN_IDLE_SECONDS": 0})
    assert r.status_code == 422 and r.json()["rule"] == "greater_than_equal"


async def test_the_mcp_run_idle_time_is_read_per_request(api, mint, ns, services):
    admin = mint(ns, "admin")
    r = await api.post(
        "/v1/settings.set",
        json={"values": {"LOOM_MCP_SESSION_RUN_IDLE_SECONDS": 42}},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert r.status_code == 200
    mcp = next(
        route.endpoint for route in api._transport.app.router.routes if getattr(route, "path", "") == "/mcp"
    )
    await api.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Authorization": f"Bearer {admin}", "accept": "application/json, text/event-stream"},
    )
    assert mcp.runs.idle_s == 42.0
