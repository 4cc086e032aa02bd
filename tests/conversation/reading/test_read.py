"""conversation.get and conversation.list: pages, order, cursors, run filter."""

from __future__ import annotations

import pytest

from loom.store import clickhouse
from tests.conversation.helpers import merges_stopped, parts_indexed


async def _thread(call, token, ns, n=7):
    turns = [
        {
            "thread_id": "t",
            "role": "tool" if i % 2 else "system",
            "content": f"turn {i}",
            "msg_id": f"m{i}",
            "run_id": "odd" if i % 2 else "even",
        }
        for i in range(n)
    ]
    r = await call("conversation.append", token, namespace=ns, turns=turns)
    assert r.json()["stored"] == n
    return [f"turn {i}" for i in range(n)]


async def _all_pages(call, token, op, **body):
    seen, cursor, pages = [], None, 0
    while True:
        r = await call(op, token, **body, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text
        pages += 1
        seen += [m["content"] for m in r.json()["messages"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return seen, pages


async def test_list_pages_in_both_orders(call, ns, writer, mint):
    viewer = mint(ns, "viewer")
    expected = await _thread(call, writer, ns)
    seen, pages = await _all_pages(call, viewer, "conversation.list", namespace=ns, thread_id="t", limit=3)
    assert seen == expected and pages == 3
    seen, _ = await _all_pages(
        call, viewer, "conversation.list", namespace=ns, thread_id="t", limit=3, order="desc"
    )
    assert seen == expected[::-1]
    seen, _ = await _all_pages(
        call, viewer, "conversation.list", namespace=ns, thread_id="t", limit=2, run_id="odd"
    )
    assert seen == ["turn 1", "turn 3", "turn 5"]
    r = await call("conversation.list", viewer, namespace=ns, thread_id="t", limit=7)
    assert len(r.json()["messages"]) == 7 and r.json()["next_cursor"] is None
    m = r.json()["messages"][0]
    assert set(m) >= {
        "msg_id",
        "ts",
        "role",
        "content",
        "reasoning",
        "user_id",
        "run_id",
        "metadata",
        "tokens",
    }
    r = await call("conversation.list", viewer, namespace=ns, thread_id="no-such-thread")
    assert r.json() == {"messages": [], "next_cursor": None}


async def test_get_with_messages_and_the_tail(call, ns, writer):
    expected = await _thread(call, writer, ns)
    r = await call("conversation.get", writer, namespace=ns, thread_id="t")
    assert r.status_code == 200  # the first page of turns comes by default, oldest first
    assert [m["content"] for m in r.json()["messages"]] == expected and r.json()["thread"]["turns"] == 7
    assert r.json()["thread"]["last_ts"] is not None
    r = await call("conversation.get", writer, namespace=ns, thread_id="t", include_messages=False)
    assert r.json()["messages"] == [] and r.json()["next_cursor"] is None  # the thread alone
    r = await call(
        "conversation.get", writer, namespace=ns, thread_id="t", include_messages=True, order="desc", limit=2
    )
    assert [m["content"] for m in r.json()["messages"]] == expected[:-3:-1]  # the tail, newest first
    seen, pages = await _all_pages(
        call, writer, "conversation.get", namespace=ns, thread_id="t", include_messages=True, limit=4
    )
    assert seen == expected and pages == 2
    r = await call("conversation.get", writer, namespace=ns, thread_id="nope")
    assert r.status_code == 404


async def test_cursors_are_opaque_and_bound_to_their_listing(call, ns, writer):
    await _thread(call, writer, ns)
    r = await call("conversation.list", writer, namespace=ns, thread_id="t", limit=2)
    cursor = r.json()["next_cursor"]
    for body in (
        dict(thread_id="t", order="desc"),
        dict(thread_id="other"),
        dict(thread_id="t", run_id="odd"),
    ):
        r = await call("conversation.list", writer, namespace=ns, limit=2, cursor=cursor, **body)
        assert r.status_code == 422 and r.json()["field"] == "cursor"
    r = await call("conversation.list", writer, namespace=ns, thread_id="t", cursor="not-a-cursor!")
    assert r.status_code == 422 and r.json()["field"] == "cursor"
    r = await call(
        "conversation.get", writer, namespace=ns, thread_id="t", include_messages=True, cursor=cursor
    )
    assert r.status_code == 422


@pytest.mark.parametrize("index_on_insert_min_rows", [clickhouse.INDEX_ON_INSERT_MIN_ROWS, 2])
async def test_the_run_filter_reads_fresh_and_merged_parts_alike(
    call, ns, writer, mint, services, monkeypatch, index_on_insert_min_rows
):
    """An append flush leaves the turns' owner and run bloom filters to the merges (built
    at insert they cost more than the rest of it); a larger insert builds its own."""
    monkeypatch.setattr(clickhouse, "INDEX_ON_INSERT_MIN_ROWS", index_on_insert_min_rows)
    viewer = mint(ns, "viewer")
    with merges_stopped(services.ch, "conversations"):
        await _thread(call, writer, ns)
        indexed = parts_indexed(services.ch, "conversations", ns)
    assert indexed and set(indexed) == {index_on_insert_min_rows <= 7}
    seen, _ = await _all_pages(call, viewer, "conversation.list", namespace=ns, thread_id="t", run_id="odd")
    assert seen == ["turn 1", "turn 3", "turn 5"]
    services.ch.command("OPTIMIZE TABLE conversations FINAL")
    assert all(parts_indexed(services.ch, "conversations", ns))
    again, _ = await _all_pages(call, viewer, "conversation.list", namespace=ns, thread_id="t", run_id="odd")
    assert again == seen
