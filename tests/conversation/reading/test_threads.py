"""conversation.threads, create and update."""

from __future__ import annotations

import json

from loom.clock import next_version
from loom.store import threads as thread_store
from tests.conversation.helpers import tombstone_turn

PASSWORD = "password=Tr0ub4dor&3xq"


async def _turn(call, token, ns, thread_id, content, role="user", agent="default", **kw):
    r = await call(
        "conversation.append",
        token,
        namespace=ns,
        agent=agent,
        thread_id=thread_id,
        role=role,
        content=content,
        **kw,
    )
    assert r.status_code == 200 and r.json()["stored"], r.text
    return r.json()


async def test_threads_newest_first_with_paging_and_agents(call, ns, writer, mint):
    viewer = mint(ns, "viewer")
    for i in range(5):
        await _turn(call, writer, ns, f"t{i}", f"turn of thread {i}", role="tool")
    await _turn(call, writer, ns, "t1", "t1 again, latest", role="tool")
    await _turn(call, writer, ns, "other", "another agent's thread", role="tool", agent="bot-2")

    r = await call("conversation.threads", viewer, namespace=ns)
    assert r.status_code == 200, r.text
    ids = [t["thread_id"] for t in r.json()["threads"]]
    assert ids == ["t1", "t4", "t3", "t2", "t0"]  # the caller's agent only, newest first
    assert r.json()["threads"][0]["excerpt"] == "t1 again, latest"
    assert r.json()["threads"][0]["last_role"] == "tool"
    r = await call("conversation.threads", viewer, namespace=ns, agent="*")
    assert [t["thread_id"] for t in r.json()["threads"]] == ["other", "t1", "t4", "t3", "t2", "t0"]
    assert r.json()["threads"][0]["agent"] == "bot-2"
    r = await call("conversation.threads", viewer, namespace=ns, agent="bot-2")
    assert [t["thread_id"] for t in r.json()["threads"]] == ["other"]

    page1 = (await call("conversation.threads", viewer, namespace=ns, limit=2)).json()
    page2 = (await call("conversation.threads", viewer, namespace=ns, limit=2, offset=2)).json()
    page3 = (await call("conversation.threads", viewer, namespace=ns, limit=2, offset=4)).json()
    assert [t["thread_id"] for t in page1["threads"] + page2["threads"] + page3["threads"]] == ids
    assert (page1["has_more"], page2["has_more"], page3["has_more"]) == (True, True, False)
    r = await call("conversation.threads", viewer, namespace=ns, offset=100_000)
    assert r.status_code == 200 and r.json()["threads"] == []
    r = await call("conversation.threads", viewer, namespace=ns, offset=100_001)
    assert r.status_code == 422


async def test_threads_window(call, ns, writer, services, mint):
    await _turn(call, writer, ns, "new", "recent", role="tool")
    # A thread whose last turn is 10 days old.
    services.ch.command(
        "INSERT INTO conversations (namespace, agent, thread_id, msg_id, ts, role, content, reasoning, user_id, "
        "run_id, metadata, tokens, high_sensitivity, version) VALUES ({ns:String}, 'default', 'old', 'm', "
        "now64(6) - INTERVAL 10 DAY, 'user', 'old turn', '', '', '', '{}', NULL, false, 1)",
        parameters={"ns": ns},
    )
    r = await call("conversation.threads", writer, namespace=ns, window_days=30)
    assert [t["thread_id"] for t in r.json()["threads"]] == ["new", "old"]
    r = await call("conversation.threads", writer, namespace=ns, window_days=7)
    assert [t["thread_id"] for t in r.json()["threads"]] == ["new"]


async def test_threads_excerpts_and_titles_that_read_as_high(call, ns, writer, services):
    shown = services.settings.conversation_search_excerpt_chars  # 240
    long_plain = "word " * 200
    await _turn(call, writer, ns, "plain", long_plain, role="tool")
    await _turn(call, writer, ns, "high", f"here you go: {PASSWORD}")
    # The secret is past the excerpt but within the 1,024 characters checked beyond it.
    await _turn(call, writer, ns, "near", "x " * (shown // 2 + 100) + PASSWORD, role="tool")
    # ... and far past them: the excerpt is shown.
    far = "y " * (shown // 2 + 700) + PASSWORD
    await _turn(call, writer, ns, "far", far, role="tool")
    # A high turn followed by a plain one: the plain last turn is the excerpt.
    await _turn(call, writer, ns, "mixed", f"my {PASSWORD}")
    await _turn(call, writer, ns, "mixed", "all good now", role="tool")
    await call("conversation.create", writer, namespace=ns, thread_id="plain", title="Release plan")
    await call("conversation.create", writer, namespace=ns, thread_id="mixed", title=f"creds {PASSWORD}")

    r = await call("conversation.threads", writer, namespace=ns)
    by_id = {t["thread_id"]: t for t in r.json()["threads"]}
    assert by_id["plain"]["excerpt"] == long_plain[:shown] and by_id["plain"]["title"] == "Release plan"
    assert by_id["high"]["excerpt"] == ""
    assert by_id["near"]["excerpt"] == ""
    assert by_id["far"]["excerpt"] == far[:shown]
    assert by_id["mixed"]["excerpt"] == "all good now"
    assert by_id["mixed"]["title"] == ""  # a title that reads as high is shown empty
    # get still serves the title and the turn verbatim.
    r = await call("conversation.get", writer, namespace=ns, thread_id="mixed", include_messages=True)
    assert r.json()["thread"]["title"].startswith("creds")
    assert r.json()["messages"][0]["content"] == f"my {PASSWORD}"


async def test_create_then_append_keeps_the_title(call, ns, writer, mint):
    r = await call(
        "conversation.create",
        writer,
        namespace=ns,
        thread_id="c1",
        title="Billing",
        metadata={"project": "ledger"},
        run_id="run-1",
    )
    assert r.status_code == 200, r.text
    assert r.json()["created"] is True and r.json()["title"] == "Billing"
    await _turn(call, writer, ns, "c1", "first turn")
    r = await call("conversation.get", mint(ns, "viewer"), namespace=ns, thread_id="c1")
    thread = r.json()["thread"]
    assert (thread["title"], thread["metadata"], thread["run_id"], thread["turns"]) == (
        "Billing",
        {"project": "ledger"},
        "run-1",
        1,
    )
    # A thread created up front is listed before it has turns.
    r = await call("conversation.create", writer, namespace=ns)
    generated = r.json()["thread_id"]
    assert generated.startswith("th_") and r.json()["created"] is True
    r = await call("conversation.threads", writer, namespace=ns)
    assert {t["thread_id"] for t in r.json()["threads"]} == {"c1", generated}
    # create on an existing thread attaches what it is given.
    r = await call("conversation.create", writer, namespace=ns, thread_id="c1", title="Billing v2")
    assert r.json()["created"] is False and r.json()["title"] == "Billing v2"
    assert r.json()["metadata"] == {"project": "ledger"}


async def test_update_replaces_metadata_and_the_title_refused_mark(call, ns, writer, services):
    await _turn(call, writer, ns, "u", "hello")
    # The titler (a later issue) marks a thread it must not title.
    row = thread_store.get(services.ch, ns, "default", "u")
    assert row is not None
    row.metadata = {"title_refused": True, "keep": 1}
    row.version = next_version()
    thread_store.insert(services.ch, [row])

    r = await call("conversation.update", writer, namespace=ns, thread_id="u", title="Hello thread")
    assert r.status_code == 200 and r.json()["metadata"] == {"title_refused": True, "keep": 1}
    r = await call(
        "conversation.update", writer, namespace=ns, thread_id="u", metadata={"team": "core"}, run_id="r9"
    )
    assert r.json()["metadata"] == {"team": "core"} and r.json()["title"] == "Hello thread"
    stored = thread_store.get(services.ch, ns, "default", "u")
    assert stored is not None
    assert json.dumps(stored.metadata) == '{"team": "core"}' and stored.run_id == "r9"
    # A client cannot set the mark itself either.
    r = await call(
        "conversation.update", writer, namespace=ns, thread_id="u", metadata={"title_refused": True}
    )
    assert r.json()["metadata"] == {}
    r = await call("conversation.update", writer, namespace=ns, thread_id="nope", title="x")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = await call("conversation.update", writer, namespace=ns, thread_id="u")
    assert r.status_code == 422


async def test_tombstoned_turns_are_filtered_from_every_read(call, ns, writer, services):
    a = await _turn(call, writer, ns, "t", "first", role="tool")
    b = await _turn(call, writer, ns, "t", "second, to be removed", role="tool")
    gone = await _turn(call, writer, ns, "gone", "only turn", role="tool")
    tombstone_turn(services.ch, ns, "default", "t", b["msg_id"], "compacted")
    tombstone_turn(services.ch, ns, "default", "gone", gone["msg_id"])

    r = await call("conversation.list", writer, namespace=ns, thread_id="t")
    assert [m["msg_id"] for m in r.json()["messages"]] == [a["msg_id"]]
    r = await call(
        "conversation.get", writer, namespace=ns, thread_id="t", include_messages=True, order="desc"
    )
    assert [m["msg_id"] for m in r.json()["messages"]] == [a["msg_id"]] and r.json()["thread"]["turns"] == 1
    r = await call("conversation.threads", writer, namespace=ns)
    threads = {t["thread_id"]: t for t in r.json()["threads"]}
    assert threads["t"]["excerpt"] == "first"  # the live last turn
    r = await call("conversation.get", writer, namespace=ns, thread_id="gone", include_messages=True)
    assert r.json()["messages"] == []
