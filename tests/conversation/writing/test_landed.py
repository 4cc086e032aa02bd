"""The landed-turn notes (loom.store.landed): append's flush skips ClickHouse's existence
read for turns the notes prove new, and every case the notes cannot rule out is still
answered from ClickHouse: re-logs after the claim expired, rows that landed before the
notes (legacy rows, rebuilt), saves' new rows, a Redis that restarted."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from loom.clock import next_version
from loom.ops.conversation.common import derive_msg_id
from loom.ops.conversation.writing.appending import claim_key
from loom.store import conversations as conv_store
from loom.store import landed, recording_cache
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import turn_rows


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[Any]]]:
    """The keys of every ClickHouse existence read the flushes make."""
    seen: list[list[Any]] = []
    real = conv_store.landed

    def spy(ch: Any, keys: Any) -> conv_store.Landed:
        keys = list(keys)
        seen.append(keys)
        return real(ch, keys)

    monkeypatch.setattr(conv_store, "landed", spy)
    yield seen


async def _ready(services: Any, ns: str) -> bool:
    mark = await services.redis.get(landed.ready_key(ns))
    return mark is not None and mark.decode() == await landed.run_id(services.redis)


async def _append(call: Any, token: str, ns: str, content: str, thread_id: str = "t") -> dict[str, Any]:
    r = await call(
        "conversation.append", token, namespace=ns, thread_id=thread_id, role="tool", content=content
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def _forget_claim(services: Any, ns: str, content: str, thread_id: str = "t") -> None:
    """As if the claim had expired (an hour later)."""
    await services.redis.delete(
        claim_key((ns, "default", thread_id, derive_msg_id(thread_id, "tool", content)))
    )


async def test_new_turns_of_a_ready_namespace_are_not_read_from_clickhouse(call, ns, writer, services, reads):
    await _append(call, writer, ns, "first")
    assert await wait_for(lambda: _ready(services, ns))
    reads.clear()
    for i in range(5):
        assert (await _append(call, writer, ns, f"turn {i}"))["stored"] is True
    assert all(not keys for keys in reads)
    assert len(turn_rows(services.ch, ns)) == 6


async def test_a_re_log_after_the_claim_expired_is_a_duplicate(call, ns, writer, services, reads):
    await _append(call, writer, ns, "once")
    assert await wait_for(lambda: _ready(services, ns))
    await _forget_claim(services, ns, "once")
    reads.clear()
    again = await _append(call, writer, ns, "once")
    assert again["stored"] is False and again["reason"] == "duplicate"
    assert [len(k) for k in reads if k] == [1]  # read from ClickHouse: the note said "maybe"
    assert len(turn_rows(services.ch, ns, final=False)) == 1


async def test_rows_that_landed_before_the_notes_are_noted_by_the_rebuild(call, ns, writer, services, reads):
    legacy = conv_store.Turn(
        ns,
        "default",
        "t",
        derive_msg_id("t", "tool", "legacy"),
        datetime.now(UTC),
        "tool",
        "legacy",
        version=next_version(),
    )
    conv_store.insert(services.ch, [legacy])  # an earlier build's row: never noted
    await _append(call, writer, ns, "starts the rebuild")
    assert await wait_for(lambda: _ready(services, ns))
    reads.clear()
    again = await _append(call, writer, ns, "legacy")
    assert again["stored"] is False and again["reason"] == "duplicate"
    assert any(reads)


async def test_a_saved_new_message_is_noted(call, ns, writer, services):
    """A save's new transcript row is noted, so a later append of that turn is a
    duplicate (not a second, unsaved version over the saved row)."""
    await _append(call, writer, ns, "warm up")
    assert await wait_for(lambda: _ready(services, ns))
    text = "a message saved before it was logged"
    r = await call(
        "conversation.save_message",
        writer,
        namespace=ns,
        user_id="u1",
        conversation_id="t",
        message_id="m-saved",
        role="user",
        content=text,
    )
    assert r.status_code == 200 and r.json()["saved"] is True, r.text
    await services.redis.delete(claim_key((ns, "default", "t", "m-saved")))
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t",
        msg_id="m-saved",
        role="user",
        content=text,
    )
    assert r.json()["stored"] is False and r.json()["reason"] == "duplicate"
    rows = [row for row in turn_rows(services.ch, ns) if row["msg_id"] == "m-saved"]
    assert len(rows) == 1 and rows[0]["is_saved"] is True


async def test_after_a_redis_restart_every_namespace_is_read_from_clickhouse_until_rebuilt(
    call, ns, writer, services, reads
):
    await _append(call, writer, ns, "before")
    assert await wait_for(lambda: _ready(services, ns))
    await services.redis.set(landed.ready_key(ns), "an-earlier-redis-process")  # the run_id changed
    reads.clear()
    assert (await _append(call, writer, ns, "after"))["stored"] is True
    assert any(reads)  # not ready: read from ClickHouse
    assert await wait_for(lambda: _ready(services, ns))  # and rebuilt


async def test_a_recording_namespace_and_one_that_does_not_in_one_flush(
    call, ns, writer, services, mint, recording
):
    quiet = ns + "q"
    recording(quiet, False)
    results = await call(
        "conversation.append",
        mint(quiet, "writer"),
        namespace=quiet,
        thread_id="t",
        role="tool",
        content="not kept",
    )
    assert results.json()["reason"] == "logging_disabled"
    recording(quiet, True)
    await services.redis.delete(claim_key((quiet, "default", "t", derive_msg_id("t", "tool", "not kept"))))
    kept = await call(
        "conversation.append",
        mint(quiet, "writer"),
        namespace=quiet,
        thread_id="t",
        role="tool",
        content="not kept",
    )
    assert kept.json()["stored"] is True  # noted while off, read from ClickHouse: not there


# -- the recording switch's cache (loom.store.recording_cache) ---------------------------


async def test_the_switch_is_read_once_then_served_from_redis_and_set_logging_takes_effect_at_once(
    call, ns, mint, services, monkeypatch
):
    from loom.store import namespaces as ns_store

    admin, token = mint(ns, "admin"), mint(ns, "writer")
    r = await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    assert r.status_code == 200, r.text
    read: list[list[str]] = []
    real = ns_store.recording

    def spy(ch: Any, nss: list[str]) -> set[str]:
        read.append(list(nss))
        return real(ch, nss)

    monkeypatch.setattr(ns_store, "recording", spy)
    assert (await _append(call, token, ns, "one"))["stored"] is True
    assert (await _append(call, token, ns, "two"))["stored"] is True
    assert read == []  # set_logging cached the new switch
    r = await call("conversation.set_logging", admin, namespace=ns, enabled=False)
    assert r.status_code == 200
    off = await _append(call, token, ns, "three")
    assert off["stored"] is False and off["reason"] == "logging_disabled"
    await services.redis.delete(recording_cache.key(ns))  # expired
    assert (await _append(call, token, ns, "four"))["reason"] == "logging_disabled"
    assert read == [[ns]]  # a miss reads ClickHouse, then caches
    assert await services.redis.get(recording_cache.key(ns)) == b"0"


async def test_a_readers_stale_switch_never_overwrites_a_writers(ns, services):
    """A reader missed, read ClickHouse ("on"), and caches it only after a writer switched
    recording off: the writer's value stands."""
    await recording_cache.forget(services.redis, ns)
    stale = {ns: True}  # read from ClickHouse before the write
    await recording_cache.forget(services.redis, ns)  # the writer: forget, write, publish
    await recording_cache.publish(services.redis, ns, False)
    await recording_cache.remember(services.redis, stale)
    assert (await recording_cache.cached(services.redis, [ns])) == {ns: False}
