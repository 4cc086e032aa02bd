"""The read index's own paths, against the real engine, Redis and worker: a restart that
rebuilds from ClickHouse and the stream, a gap in the stream, the fallbacks (no index, a
namespace it does not hold) and a deletion racing searches."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from loom.auth.principal import Principal, Role
from loom.ops.conversation.reading import index_search, searching
from loom.read_index import feed
from tests.conversation.helpers import append_turn, ok
from tests.read_index.serving import index_server, loaded, searching_through

TEXTS = {
    "deploy": "we rolled back the staging cluster deploy after the canary failed",
    "billing": "the invoice export job now writes to the new ledger every night",
    "cooking": "grandma's lasagna needs fresh basil and a slow oven",
}


def _who(ns: str) -> Principal:
    return Principal("test", (ns,), Role.viewer)


async def _seed(call: Any, writer: str, ns: str, thread: str = "t", texts: dict[str, str] = TEXTS) -> None:
    for msg, text in texts.items():
        await append_turn(call, writer, ns, "default", thread, "user", text, msg_id=msg)


async def _ids(svc: Any, ns: str, query: str) -> tuple[list[str], str | None, list[str]]:
    got = await searching.search(svc, _who(ns), query, namespace=ns)
    return [h.msg_id for h in got.hits], got.fallback_reason, got.plan


@pytest.fixture
def sock(tmp_home: Path) -> Path:
    return tmp_home / f"ri-{time.monotonic_ns() % 10**8}.sock"


async def test_a_restarted_index_rebuilds_from_the_store_and_the_stream(
    call, ns, writer, mint, services, sock
):
    """The index stops mid-stream; turns are written and one deleted while it is away; a
    new one loads the namespace from ClickHouse and applies the events after its
    watermark: it finds what was written, never what was deleted."""
    admin = mint(ns, "admin")
    async with index_server(services, sock) as first:
        await loaded(first)
        with searching_through(services, sock):
            await _seed(call, writer, ns, texts={"deploy": TEXTS["deploy"]})
            assert (await _ids(services, ns, "staging deploy rolled back"))[0:2] == (["deploy"], None)
    with searching_through(services, sock):  # no index now: the engine answers, and says so
        await _seed(
            call,
            writer,
            ns,
            texts={"billing": TEXTS["billing"], "later": "the staging deploy rolled back twice"},
        )
        await ok(
            call,
            "conversation.delete_message",
            admin,
            namespace=ns,
            agent="default",
            thread_id="t",
            msg_id="deploy",
        )
        ids, reason, _ = await _ids(services, ns, "staging deploy rolled back")
        assert ids == ["later"] and reason == index_search.INDEX_UNAVAILABLE
        async with index_server(services, sock) as second:
            await loaded(second)
            assert second.index.held[ns].vectors.where.keys() == {("t", "billing"), ("t", "later")}
            ids, reason, plan = await _ids(services, ns, "staging deploy rolled back")
            assert (ids, reason, plan) == (["later"], None, [index_search.INDEX_PLAN])
            await _seed(call, writer, ns, texts={"cooking": TEXTS["cooking"]})  # after the start: by event
            assert (await _ids(services, ns, "lasagna basil oven"))[0:2] == (["cooking"], None)


async def test_a_gap_in_the_stream_reloads_everything(call, ns, writer, services, sock):
    async with index_server(services, sock) as server:
        await loaded(server)
        with searching_through(services, sock):
            await _seed(call, writer, ns)
            assert (await _ids(services, ns, "invoice ledger export"))[0] == ["billing"]
            gaps = server.index.stats.gaps
            server.position = (1, 0)  # as if the index had fallen behind a trimmed stream
            await services.redis.xtrim(feed.STREAM, maxlen=1)
            await server._gap_check()
            assert server.index.stats.gaps == gaps + 1
            await loaded(server)
            ids, reason, _ = await _ids(services, ns, "invoice ledger export")
            assert ids == ["billing"] and reason is None


async def test_a_namespace_the_index_cannot_hold_is_searched_in_the_engine_and_says_so(
    call, ns, writer, services, sock
):
    await _seed(call, writer, ns)
    async with index_server(services, sock, budget_mb=0) as server:  # nothing fits
        await loaded(server)
        with searching_through(services, sock):
            ids, reason, plan = await _ids(services, ns, "invoice ledger export")
            assert ids == ["billing"] and reason == index_search.INDEX_MISSING and "read_index" in plan


async def test_a_deletion_racing_searches_is_never_answered_after_it_returned(
    call, ns, writer, mint, services, read_index
):
    """Searches run back to back while one turn is deleted: every search that started
    after the deletion answered leaves the turn out, whatever the index has applied."""
    await _seed(call, writer, ns)
    admin = mint(ns, "admin")
    assert (await _ids(services, ns, "staging deploy rolled back"))[0][0] == "deploy"
    done_at: list[float] = []
    seen: list[tuple[float, list[str], str | None]] = []

    async def searches() -> None:
        while not done_at or time.monotonic() < done_at[0] + 0.5:
            started = time.monotonic()
            ids, reason, _ = await _ids(services, ns, "staging deploy rolled back")
            seen.append((started, ids, reason))

    async def delete() -> None:
        await asyncio.sleep(0.05)
        await ok(
            call,
            "conversation.delete_message",
            admin,
            namespace=ns,
            agent="default",
            thread_id="t",
            msg_id="deploy",
        )
        done_at.append(time.monotonic())

    await asyncio.gather(searches(), delete())
    after = [ids for started, ids, _ in seen if started > done_at[0]]
    assert after and all("deploy" not in ids for ids in after)
    assert all(reason is None for _, _, reason in seen)  # the index answered every one
    assert any("deploy" in ids for started, ids, _ in seen if started < done_at[0])  # the race was real


async def test_its_memory_lag_and_hit_rate_are_on_health_and_metrics(
    call, api, ns, writer, mint, services, read_index
):
    await _seed(call, writer, ns)
    await _ids(services, ns, "invoice ledger export")
    shown = await ok(call, "health.show", mint(ns, "admin"))
    ri = shown["read_index"]
    assert ri["state"] == "ok" and ri["namespaces"] >= 1 and ri["rows"] >= 3
    assert 0 < ri["bytes"] <= ri["budget_bytes"] and ri["searches"] >= 1 and 0 < ri["hit_rate"] <= 1
    assert ri["lag_p99_ms"] >= ri["lag_p50_ms"] >= 0
    text = (await api.get("/metrics")).text
    assert "loom_read_index_up 1.0" in text and "loom_read_index_lag_p99_ms" in text
    rows = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("loom_read_index_rows "))
    assert rows == read_index.index.rows


async def test_without_an_index_health_says_off_and_searches_read_the_engine_silently(
    call, ns, writer, mint, services
):
    await _seed(call, writer, ns)
    shown = await ok(call, "health.show", mint(ns, "admin"))
    assert shown["read_index"]["state"] == "off"
    ids, reason, plan = await _ids(services, ns, "invoice ledger export")
    assert ids == ["billing"] and reason is None and "read_index" not in plan
