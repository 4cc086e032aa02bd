"""settings.get / settings.set and the live settings: where each value comes from, the
round trip, clearing, all-or-nothing validation, roles and scopes, an override in force
in the calling process at once (conversation.search), a second process's follower, and
the titler's live cadence. The cross-process test (a real `loom serve`) is in
tests/platform/test_live_settings_processes.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.ops.conversation.lifecycle import titler_tick
from loom.ops.platform import live_settings
from loom.ops.platform import settings as ops
from loom.settings import Settings
from loom.store import settings_overrides as store
from tests.conversation.conftest import wait_for

EXCERPT = "LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS"
FLOOR = "LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY"
INTERVAL = "LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS"
ENABLED = "LOOM_CONVERSATION_TITLER_ENABLED"
ALL = [live_settings.env_name(f) for f in live_settings.LIVE_SETTINGS]
ADMIN = Principal("settings-test", ("x",), Role.admin)


@pytest.fixture(autouse=True)
async def _no_overrides_left(services: Any) -> AsyncIterator[None]:
    """Each test starts and ends with no override stored (the session's processes share
    the table): every one cleared, in force here at once."""
    await ops.update(services, ADMIN, dict.fromkeys(ALL))
    yield
    await ops.update(services, ADMIN, dict.fromkeys(ALL))


def _last_write(services: Any) -> int:
    """The newest version written (merges may fold rows; a write always adds a newer one)."""
    return int(services.ch.query("SELECT max(version) FROM settings_overrides").result_rows[0][0])


def _by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in body["settings"]}


async def _get(call: Any, token: str) -> dict[str, dict[str, Any]]:
    r = await call("settings.get", token)
    assert r.status_code == 200, r.text
    return _by_name(r.json())


async def test_get_lists_the_live_settings_with_their_defaults_types_and_bounds(call, ns, mint, services):
    shown = await _get(call, mint(ns, "admin"))
    assert sorted(shown) == sorted(ALL)
    excerpt = shown[EXCERPT]
    assert excerpt["value"] == excerpt["default"] == services.base_settings.conversation_search_excerpt_chars
    assert excerpt["source"] == "default" and excerpt["type"] == "int"
    assert (excerpt["min"], excerpt["max"]) == (1, 100_000) and excerpt["description"]
    assert excerpt["updated_at"] is None and excerpt["updated_by"] == ""
    assert shown[FLOOR]["type"] == "float" and (shown[FLOOR]["min"], shown[FLOOR]["max"]) == (-1.0, 1.0)
    assert shown[ENABLED]["type"] == "bool" and shown[ENABLED]["min"] is None
    assert shown[INTERVAL]["min"] == 10 and shown[INTERVAL]["max"] == 86_400


async def test_a_value_from_the_environment_says_so(services, monkeypatch):
    monkeypatch.setenv("LOOM_CONVERSATION_TITLER_MIN_TURNS", "7")
    base = services.base_settings
    env = Settings(**{k: getattr(base, k) for k in base.model_fields_set})
    svc = dataclasses.replace(services, settings=env, extras={})
    shown = {v.name: v for v in (await ops.show(svc, ADMIN)).settings}
    turns = shown["LOOM_CONVERSATION_TITLER_MIN_TURNS"]
    assert (turns.value, turns.default, turns.source) == (7, 7, "environment")
    assert shown[EXCERPT].source == "default"
    await ops.update(svc, ADMIN, {"LOOM_CONVERSATION_TITLER_MIN_TURNS": 9})
    turns = {v.name: v for v in (await ops.show(svc, ADMIN)).settings}["LOOM_CONVERSATION_TITLER_MIN_TURNS"]
    assert (turns.value, turns.default, turns.source) == (9, 7, "override")
    assert svc.settings.conversation_titler_min_turns == 9


async def test_set_then_get_round_trip_and_null_clears(call, ns, mint, services):
    admin = mint(ns, "admin")
    r = await call("settings.set", admin, values={EXCERPT: 400, FLOOR: 0.5, ENABLED: False})
    assert r.status_code == 200, r.text
    answered = _by_name(r.json())
    shown = await _get(call, admin)
    assert shown == answered
    assert (shown[EXCERPT]["value"], shown[EXCERPT]["source"]) == (400, "override")
    assert shown[EXCERPT]["default"] == services.base_settings.conversation_search_excerpt_chars
    assert shown[EXCERPT]["updated_at"] and shown[EXCERPT]["updated_by"]
    assert (shown[FLOOR]["value"], shown[ENABLED]["value"]) == (0.5, False)
    assert services.settings.conversation_search_excerpt_chars == 400
    assert not services.settings.conversation_titler_enabled
    # A string is read as the environment would read it (what a form sends).
    r = await call("settings.set", admin, values={INTERVAL: "600"})
    assert _by_name(r.json())[INTERVAL]["value"] == 600
    # null clears: the default is back, the other overrides stay.
    r = await call("settings.set", admin, values={EXCERPT: None})
    assert r.status_code == 200, r.text
    shown = await _get(call, admin)
    assert shown[EXCERPT]["source"] == "default" and shown[EXCERPT]["updated_at"] is None
    assert shown[FLOOR]["source"] == "override"
    assert (
        services.settings.conversation_search_excerpt_chars
        == services.base_settings.conversation_search_excerpt_chars
    )
    assert set(store.live(services.ch)) == {
        "conversation_search_min_similarity",
        "conversation_titler_enabled",
        "conversation_titler_interval_seconds",
    }


@pytest.mark.parametrize(
    ("values", "field", "rule"),
    [
        ({EXCERPT: 0}, f"values.{EXCERPT}", "greater_than_equal"),
        ({EXCERPT: 100_001}, f"values.{EXCERPT}", "less_than_equal"),
        ({EXCERPT: 2.5}, f"values.{EXCERPT}", "int_type"),
        ({EXCERPT: True}, f"values.{EXCERPT}", "int_type"),
        ({EXCERPT: "many"}, f"values.{EXCERPT}", "int_parsing"),
        ({FLOOR: 1.5}, f"values.{FLOOR}", "less_than_equal"),
        ({INTERVAL: 5}, f"values.{INTERVAL}", "greater_than_equal"),
        ({ENABLED: 1}, f"values.{ENABLED}", "bool_type"),
        ({"LOOM_PORT": 80}, "values.LOOM_PORT", "unknown_setting"),
        (
            {"LOOM_conversation_search_excerpt_chars": 300},
            "values.LOOM_conversation_search_excerpt_chars",
            "unknown_setting",
        ),
        (
            {"conversation_search_excerpt_chars": 300},
            "values.conversation_search_excerpt_chars",
            "unknown_setting",
        ),
        ({}, "values", "empty"),
        # One bad value among good ones: nothing is written.
        ({FLOOR: 0.4, EXCERPT: 300, INTERVAL: 1}, f"values.{INTERVAL}", "greater_than_equal"),
    ],
)
async def test_a_bad_value_is_a_422_naming_it_and_nothing_is_written(
    call, ns, mint, services, values, field, rule
):
    before_rows = _last_write(services)
    before = services.settings
    r = await call("settings.set", mint(ns, "admin"), values=values)
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["error"], body["field"], body["rule"]) == ("invalid_request", field, rule)
    assert _last_write(services) == before_rows and store.live(services.ch) == {}
    assert services.settings == before


async def test_a_body_without_values_or_with_a_nested_value_is_refused(call, ns, mint):
    admin = mint(ns, "admin")
    r = await call("settings.set", admin)
    assert r.status_code == 422 and r.json()["field"] == "values"
    r = await call("settings.set", admin, values={EXCERPT: [300]})
    assert r.status_code == 422 and r.json()["field"].startswith(f"values.{EXCERPT}")


@pytest.mark.parametrize("op", ["settings.get", "settings.set"])
async def test_viewers_writers_and_bounded_admins_are_refused(call, ns, mint, services, op):
    body = {"values": {EXCERPT: 300}} if op == "settings.set" else {}
    for token in (mint(ns, "viewer"), mint(ns, "writer")):
        r = await call(op, token, **body)
        assert r.status_code == 403 and r.json()["rule"] == "role", r.text
    bounded = mint(ns, "admin", read_scope="own_user", read_user_id="u1")
    r = await call(op, bounded, **body)
    assert r.status_code == 403 and r.json()["rule"] == "read_scope", r.text
    assert store.live(services.ch) == {}
    # The op refuses them too (not only the route).
    with pytest.raises(Exception, match="bound to one user"):
        await ops.show(services, Principal("b", (ns,), Role.admin, "own_user", "u1"))
    with pytest.raises(Exception, match="admin role"):
        await ops.update(services, Principal("w", (ns,), Role.writer), {EXCERPT: 300})


async def test_an_override_changes_search_at_once_in_the_same_process(call, ns, writer, mint):
    long = "staging deploy " + "x" * 600
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[{"thread_id": "t", "msg_id": "long", "role": "user", "content": long}],
    )
    assert r.status_code == 200 and r.json()["results"][0]["stored"], r.text
    viewer, admin = mint(ns, "viewer"), mint(ns, "admin")

    async def hits() -> list[dict[str, Any]]:
        r = await call("conversation.search", viewer, namespace=ns, query="staging deploy")
        assert r.status_code == 200, r.text
        return r.json()["hits"]  # type: ignore[no-any-return]

    assert [len(h["excerpt"]) for h in await hits()] == [240]
    await call("settings.set", admin, values={EXCERPT: 37})
    assert [h["excerpt"] for h in await hits()] == [long[:37]]
    await call("settings.set", admin, values={FLOOR: 0.99})  # "staging deploy" vs 3 words: below
    assert await hits() == []
    await call("settings.set", admin, values={FLOOR: None, EXCERPT: None})
    assert [len(h["excerpt"]) for h in await hits()] == [240]


async def test_another_process_follows_within_a_second_and_skips_what_it_cannot_apply(services):
    """A second process's follower (polling fast here): the change is in force there
    without a restart; an override this build cannot validate is skipped, not fatal; a
    test's own change of a setting that is not live stays."""
    other = dataclasses.replace(
        services, settings=services.base_settings.model_copy(update={"compact_concurrency": 7}), extras={}
    )
    follower = live_settings.Follower(other, poll_s=0.05)
    await follower.start()
    try:
        await ops.update(services, ADMIN, {EXCERPT: 55, ENABLED: False})

        async def followed() -> bool:
            return other.settings.conversation_search_excerpt_chars == 55

        assert await wait_for(followed, timeout=5)
        assert not other.settings.conversation_titler_enabled
        assert other.settings.compact_concurrency == 7  # only the live settings are touched
        # A value a newer build allowed, stored behind this build's back: skipped.
        await services.run(store.write, services.ch, {"conversation_titler_min_turns": 0}, "newer-build")
        await services.run(store.write, services.ch, {"conversation_search_min_similarity": 0.45}, "x")
        await live_settings.bump(services)

        async def floor_followed() -> bool:
            return other.settings.conversation_search_min_similarity == 0.45

        assert await wait_for(floor_followed, timeout=5)
        assert (
            other.settings.conversation_titler_min_turns
            == services.base_settings.conversation_titler_min_turns
        )
        assert follower._task is not None and not follower._task.done()
        shown = {v.name: v for v in (await ops.show(services, ADMIN)).settings}
        assert shown["LOOM_CONVERSATION_TITLER_MIN_TURNS"].source == "default"
        # Cleared everywhere: the environment's values come back.
        await ops.update(services, ADMIN, dict.fromkeys(ALL))

        async def back() -> bool:
            return (
                other.settings.conversation_search_excerpt_chars
                == services.base_settings.conversation_search_excerpt_chars
            )

        assert await wait_for(back, timeout=5)
        assert (
            other.settings.conversation_titler_enabled == services.base_settings.conversation_titler_enabled
        )
    finally:
        await follower.stop()


async def test_a_follower_outlives_a_backend_that_is_away(services):
    """ClickHouse and then Redis unreachable: the follower says so and retries; it never
    ends the process."""
    from redis.asyncio import Redis

    from loom.store.clickhouse import connect
    from tests.relay import Relay

    relay = Relay(services.settings.clickhouse_url)
    ch = connect(f"http://127.0.0.1:{relay.port}", database=services.settings.clickhouse_database)
    other = dataclasses.replace(services, ch=ch, extras={})
    follower = live_settings.Follower(other, poll_s=0.02, refresh_s=0.05)
    await follower.start()
    try:
        relay.kill()
        await ops.update(services, ADMIN, {EXCERPT: 77})
        await asyncio.sleep(0.5)
        assert follower._task is not None and not follower._task.done()
        assert other.settings.conversation_search_excerpt_chars != 77  # it could not read it
        # Redis away too.
        other.redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
        await asyncio.sleep(0.5)
        assert not follower._task.done()
        await other.redis.aclose()
    finally:
        await follower.stop()
        relay.kill()


async def _age_last_pass(services: Any, seconds: float) -> None:
    now_s, now_us = await services.redis.time()
    await services.redis.set(titler_tick.LAST_PASS_KEY, f"{now_s + now_us / 1e6 - seconds:.3f}")


async def test_the_titler_tick_follows_the_live_switch_and_interval(services):
    await services.redis.delete(titler_tick.LAST_PASS_KEY)
    await ops.update(services, ADMIN, {ENABLED: False})
    assert not await titler_tick.due(services)
    assert await services.redis.get(titler_tick.LAST_PASS_KEY) is None
    await ops.update(services, ADMIN, {ENABLED: True, INTERVAL: 300})
    assert await titler_tick.due(services)  # no pass yet: due now, and recorded
    assert not await titler_tick.due(services)  # a second worker's tick: not again
    await _age_last_pass(services, 60)
    assert not await titler_tick.due(services)  # 60 s ago, every 300 s: not yet
    await ops.update(services, ADMIN, {INTERVAL: 30})  # shortened, no restart
    assert await titler_tick.due(services)
    await _age_last_pass(services, 25)
    assert not await titler_tick.due(services)
    await _age_last_pass(services, 31)
    report = await titler_tick.tick(services)  # due; the fake LLM's pass does nothing
    assert not report.ran and not await titler_tick.due(services)


async def test_two_workers_ticking_at_once_start_one_pass(services):
    await services.redis.delete(titler_tick.LAST_PASS_KEY)
    await ops.update(services, ADMIN, {ENABLED: True, INTERVAL: 300})
    started = await asyncio.gather(*(titler_tick.due(services) for _ in range(8)))
    assert sorted(started) == [False] * 7 + [True]
