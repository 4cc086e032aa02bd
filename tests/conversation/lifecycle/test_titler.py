"""The conversation_titler: titles written by the stand-in chat model, high turns never
sent, title_refused marks and their reset, one pass at a time, the cron's settings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loom.leases import Lease
from loom.ops.conversation.lifecycle import titler_tick, titling
from loom.providers.llm import OpenAICompatLLM
from loom.store import threads as thread_store
from tests.conversation.helpers import ok, revise_turn, turn_rows
from tests.providers.standin import StandInServer
from workers.main import cron_jobs

HIGHS = [f"my PIN is {4000 + i}" for i in range(8)]
TITLE = "Storage cluster migration plan"


@pytest.fixture
def titler(services: Any) -> Iterator[StandInServer]:
    with StandInServer() as srv:
        srv.set_handler(srv.CHAT, lambda req: srv.chat_ok(TITLE))
        before = services.llm
        services.llm = OpenAICompatLLM(base_url=srv.url, model="stand-in", timeout=5.0)
        yield srv
        services.llm = before


async def _thread(call: Any, writer: str, ns: str, thread: str, texts: list[str]) -> None:
    turns = [
        {"thread_id": thread, "role": "user" if i % 2 == 0 else "assistant", "content": t}
        for i, t in enumerate(texts)
    ]
    await ok(call, "conversation.append", writer, namespace=ns, turns=turns)


def _plain(n: int) -> list[str]:
    return [f"plain turn {i} about the storage cluster" for i in range(n)]


def _row(services: Any, ns: str, thread: str) -> thread_store.ThreadRow:
    row = thread_store.get(services.ch, ns, "default", thread)
    assert row is not None
    return row


async def test_with_the_fake_llm_a_pass_does_nothing(call, ns, writer, services):
    await _thread(call, writer, ns, "t", _plain(4))
    report = await titling.titler_pass(services, [ns])
    assert not report.ran and _row(services, ns, "t").title == ""


async def test_an_untitled_thread_gets_a_title_that_threads_returns(call, ns, writer, services, titler):
    await _thread(call, writer, ns, "t", _plain(4))
    await _thread(call, writer, ns, "short", _plain(3))
    await ok(call, "conversation.create", writer, namespace=ns, thread_id="named", title="Mine")
    await _thread(call, writer, ns, "named", _plain(4))
    report = await titling.titler_pass(services, [ns])
    assert report.ran and report.titled == 1
    listed = await ok(call, "conversation.threads", writer, namespace=ns)
    titles = {t["thread_id"]: t["title"] for t in listed["threads"]}
    assert titles == {"t": TITLE, "short": "", "named": "Mine"}
    assert len(titler.requests_to(titler.CHAT)) == 1
    # Titled threads are not asked again.
    assert (await titling.titler_pass(services, [ns])).titled == 0


async def test_high_turns_are_never_sent(call, ns, writer, services, titler):
    await _thread(
        call, writer, ns, "t", [HIGHS[0], "plain question about the cluster", HIGHS[1], "plain answer"]
    )
    await titling.titler_pass(services, [ns])
    sent = "\n".join(m["content"] for m in titler.requests_to(titler.CHAT)[0].json["messages"])
    assert "plain question" in sent and all(h not in sent for h in HIGHS)
    assert _row(services, ns, "t").title == TITLE


async def test_eight_high_turns_mark_the_thread_refused_fewer_wait(call, ns, writer, services, titler):
    await _thread(call, writer, ns, "all-high", HIGHS)
    await _thread(call, writer, ns, "some-high", HIGHS[:5])
    report = await titling.titler_pass(services, [ns])
    assert report.refused == 1 and report.waiting == 1 and not titler.requests_to(titler.CHAT)
    assert _row(services, ns, "all-high").metadata.get("title_refused") is True
    assert "title_refused" not in _row(services, ns, "some-high").metadata
    # A plain turn comes: the waiting thread is titled from it.
    await _thread(call, writer, ns, "some-high", ["a plain turn at last"])
    await titling.titler_pass(services, [ns])
    assert _row(services, ns, "some-high").title == TITLE
    assert _row(services, ns, "all-high").title == ""


async def test_a_high_title_marks_refused_and_new_metadata_resets_the_mark(
    call, ns, writer, services, titler
):
    await _thread(call, writer, ns, "t", _plain(4))
    titler.set_handler(titler.CHAT, lambda req: titler.chat_ok(HIGHS[0]))
    assert (await titling.titler_pass(services, [ns])).refused == 1
    row = _row(services, ns, "t")
    assert row.title == "" and row.metadata["title_refused"] is True
    # Marked: not asked again.
    await titling.titler_pass(services, [ns])
    assert len(titler.requests_to(titler.CHAT)) == 1
    # New metadata replaces the mark; the titler asks once more (and marks again).
    await ok(call, "conversation.update", writer, namespace=ns, thread_id="t", metadata={"project": "x"})
    assert "title_refused" not in _row(services, ns, "t").metadata
    assert (await titling.titler_pass(services, [ns])).refused == 1
    assert len(titler.requests_to(titler.CHAT)) == 2
    assert _row(services, ns, "t").metadata == {"project": "x", "title_refused": True}
    # conversation.create's metadata resets it too; a plain title then lands.
    await ok(call, "conversation.create", writer, namespace=ns, thread_id="t", metadata={"project": "y"})
    titler.set_handler(titler.CHAT, lambda req: titler.chat_ok(TITLE))
    assert (await titling.titler_pass(services, [ns])).titled == 1
    assert _row(services, ns, "t").title == TITLE


async def test_one_titler_at_a_time(call, ns, writer, services, titler):
    await _thread(call, writer, ns, "t", _plain(4))
    held = Lease(services.redis, titling.LEASE_KEY)
    assert await held.try_acquire()
    try:
        assert not (await titling.titler_pass(services, [ns])).ran
    finally:
        await held.release()
    assert (await titling.titler_pass(services, [ns])).titled == 1


async def test_switched_off_it_does_nothing_and_the_cron_follows_the_settings(
    call, ns, writer, services, titler
):
    await _thread(call, writer, ns, "t", _plain(4))
    off = services.settings.model_copy(update={"conversation_titler_enabled": False})
    # The cron ticks whatever the settings say: the tick reads the switch and the
    # interval live (tests/conversation/test_live_settings.py covers the tick's gate).
    for cfg in (off, services.settings):
        job = next(j for j in cron_jobs(cfg) if j.name == "conversation_titler")
        assert job.second == set(range(0, 60, titler_tick.TICK_S)) and job.minute is None
    before = services.settings
    services.settings = off
    try:
        assert not (await titling.titler_pass(services, [ns])).ran
    finally:
        services.settings = before


async def test_the_window_min_turns_and_cap_are_read(call, ns, writer, services, titler):
    """Each setting decides on its own: the cap bounds a pass, a thread with fewer live
    turns than the minimum is left alone, and so is one last active before the window
    until the window reaches back to it."""
    for i in range(3):
        await _thread(call, writer, ns, f"t{i}", _plain(2))
    await _thread(call, writer, ns, "short", _plain(1))
    await _thread(call, writer, ns, "old", _plain(3))
    for r in turn_rows(services.ch, ns):
        if r["thread_id"] == "old":  # its last activity three hours ago
            revise_turn(services.ch, ns, "default", "old", r["msg_id"], ts="ts - INTERVAL 3 HOUR")
    before = services.settings
    window = {
        "conversation_titler_window_hours": 2,
        "conversation_titler_min_turns": 2,
        "conversation_titler_max_threads_per_pass": 2,
    }
    services.settings = before.model_copy(update=window)
    try:
        assert [(await titling.titler_pass(services, [ns])).titled for _ in range(3)] == [2, 1, 0]
        assert {_row(services, ns, t).title for t in ("t0", "t1", "t2")} == {TITLE}
        assert _row(services, ns, "old").title == "" and _row(services, ns, "short").title == ""
        services.settings = before.model_copy(update={**window, "conversation_titler_window_hours": 4})
        assert (await titling.titler_pass(services, [ns])).titled == 1
        assert _row(services, ns, "old").title == TITLE and _row(services, ns, "short").title == ""
    finally:
        services.settings = before


async def test_a_namespace_that_does_not_record_gets_no_titles(call, ns, writer, services, titler, recording):
    await _thread(call, writer, ns, "t", _plain(4))
    recording(ns, False)  # its turns were recorded while the switch was on
    assert (await titling.titler_pass(services, [ns])).titled == 0
    assert not titler.requests_to(titler.CHAT) and _row(services, ns, "t").title == ""
    recording(ns, True)
    assert (await titling.titler_pass(services, [ns])).titled == 1
