"""A user erasure racing the user's appends (the erasure fence), the user's thread rows,
and what "gone from disk" means for the removal (the part files, not a mask)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from loom.auth.principal import Principal, Role
from loom.ops.conversation import append, close_pipeline
from loom.ops.erasure import requesting
from loom.store import erasure as erasure_store
from loom.store import fences
from tests.conversation.helpers import ok, turn, turn_rows


def _live(rows: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["user_id"] == user and not r["tombstoned"]]


async def test_an_append_racing_a_user_erasure_leaves_no_readable_row_of_the_user(
    ns, writer, services, other_services, monkeypatch
):
    """An append of the user stamped while the erasure runs, whose flush lands after the
    erasure fixed its keys (so the erasure's own reads never see it), erases its own turn
    (answers deleted); an append after the erasure answered is a new turn."""
    del writer  # the fixture turns recording on
    writer = Principal("w", (ns,), Role.writer)
    admin = Principal("x", (ns,), Role.admin)
    await append(services, writer, ns, "a", [turn("t1", "user", "u1 landed first", user_id="u1")])
    keys_fixed, go_on = threading.Event(), threading.Event()
    original = erasure_store.fix_user_keys

    def fix_then_wait(*args: Any, **kwargs: Any) -> Any:
        got = original(*args, **kwargs)
        keys_fixed.set()
        go_on.wait(10)  # the racing append lands here: after the read, before the tombstones
        return got

    monkeypatch.setattr(erasure_store, "fix_user_keys", fix_then_wait)
    # A second API process with a long flush window: its row lands well after it is stamped.
    slow = other_services(write_batch_embed_wait_ms=300.0, write_batch_max_wait_ms=300.0)
    erasing = asyncio.create_task(
        requesting.request(services, admin, user_id="u1", namespaces=None, namespace_list=None, purge=False)
    )
    assert await asyncio.to_thread(keys_fixed.wait, 10)
    racing = [
        asyncio.create_task(
            append(slow, writer, ns, "a", [turn("t-new", "user", f"u1 racing {i}", user_id="u1")])
        )
        for i in range(3)
    ] + [asyncio.create_task(append(slow, writer, ns, "a", [turn("t2", "user", "u2 stays", user_id="u2")]))]
    answers = [r for t in racing for r in await t]
    go_on.set()
    await erasing
    await close_pipeline(slow)
    assert [a.reason for a in answers[:3]] == ["deleted"] * 3 and all(not a.stored for a in answers[:3])
    assert answers[3].stored
    rows = turn_rows(services.ch, ns)
    assert _live(rows, "u1") == []
    assert {r["tombstone_reason"] for r in rows if r["user_id"] == "u1"} == {"erased"}
    assert len(_live(rows, "u2")) == 1
    # The fence now sits at the answer: a turn appended afterwards is new, and kept.
    after = await append(services, writer, ns, "a", [turn("t3", "user", "u1 comes back", user_id="u1")])
    assert after[0].stored
    assert len(_live(turn_rows(services.ch, ns), "u1")) == 1


async def test_appends_running_throughout_an_erasure_leave_only_turns_stamped_after_it(ns, writer, services):
    """Free-running concurrency: appends of the user in a loop while the erasure runs.
    Afterwards no live row of the user is stamped below the fence the erasure left (its
    answer's version)."""
    del writer  # the fixture turns recording on
    writer = Principal("w", (ns,), Role.writer)
    admin = Principal("x", (ns,), Role.admin)
    await append(services, writer, ns, "a", [turn("t0", "user", "u1 before", user_id="u1")])
    stop = asyncio.Event()

    async def keep_appending(k: int) -> None:
        i = 0
        while not stop.is_set():
            await append(
                services, writer, ns, "a", [turn(f"t{k}-{i % 3}", "user", f"u1 {k} {i}", user_id="u1")]
            )
            i += 1

    loops = [asyncio.create_task(keep_appending(k)) for k in range(3)]
    await asyncio.sleep(0.2)
    await requesting.request(services, admin, user_id="u1", namespaces=None, namespace_list=None, purge=False)
    stop.set()
    await asyncio.gather(*loops)
    _, by_user = await fences.all_fences(services.redis, [], [(ns, "u1")])
    fence = by_user[(ns, "u1")]
    rows = turn_rows(services.ch, ns)
    assert rows and any(r["tombstone_reason"] == "erased" for r in rows)
    assert [r for r in _live(rows, "u1") if r["version"] < fence] == []


async def test_a_user_erasure_settles_the_users_thread_rows(call, ns, writer, mint, services):
    """A thread left with no live turn is tombstoned (title and metadata emptied) and its
    every version removed from disk; a thread other users' turns live on in keeps its
    row, its title (written from the thread's text) emptied and older versions removed."""
    admin = mint(ns, "admin")
    ch = services.ch
    for thread, user in (("solo", "u1"), ("mixed", "u1"), ("mixed", "u2"), ("other", "u2")):
        await ok(
            call,
            "conversation.append",
            writer,
            namespace=ns,
            thread_id=thread,
            role="user",
            content=f"{user} writes in {thread}",
            user_id=user,
        )
    for thread in ("solo", "mixed", "other"):
        await ok(call, "conversation.update", writer, namespace=ns, thread_id=thread, title=f"about {thread}")
    got = await ok(call, "erasure.request", admin, user_id="u1")
    line = got["receipt"]["tables"]["threads"]
    assert line["tombstoned"] == 2 and len(line["digests"][ns]) == 16
    listed = await ok(call, "conversation.threads", admin, namespace=ns)
    titles = {t["thread_id"]: t["title"] for t in listed["threads"]}
    assert "solo" not in titles and titles["mixed"] == "" and titles["other"] == "about other"
    newest = {
        r["thread_id"]: r
        for r in ch.query(
            "SELECT thread_id, title, metadata, tombstoned FROM threads FINAL WHERE namespace = {ns:String}",
            parameters={"ns": ns},
        ).named_results()
    }
    assert (newest["solo"]["tombstoned"], newest["solo"]["title"], newest["solo"]["metadata"]) == (
        True,
        "",
        "{}",
    )
    assert (newest["mixed"]["tombstoned"], newest["mixed"]["title"]) == (False, "")
    r = await call("conversation.get", admin, namespace=ns, thread_id="solo")
    assert r.status_code == 404

    async def removed() -> bool:
        body = (await call("erasure.status", admin, erasure_id=got["erasure_id"])).json()
        return body["state"] == "done"

    from tests.conversation.conftest import wait_for

    assert await wait_for(removed, timeout=30)
    versions = ch.query(
        "SELECT thread_id, title, tombstoned FROM threads WHERE namespace = {ns:String} "
        "SETTINGS apply_deleted_mask = 0",
        parameters={"ns": ns},
    ).named_results()
    by_thread: dict[str, list[dict[str, Any]]] = {}
    for v in versions:
        by_thread.setdefault(v["thread_id"], []).append(v)
    assert "solo" not in by_thread  # every version gone from disk
    assert [v["title"] for v in by_thread["mixed"]] == [""]  # only the emptied version left
    assert "about other" in [v["title"] for v in by_thread["other"]]


async def test_a_row_that_lands_between_the_key_fixing_and_the_tombstones_is_removed_too(
    ns, writer, services, monkeypatch
):
    """The keys are fixed beside the tombstones, which name the user's rows by thread and
    owner: a row of the user that lands after the keys were read but before the
    tombstones read the threads is tombstoned, and keyed after, so the removal takes it
    from disk as well (no tombstone of it, with its text, left in the part files)."""
    del writer  # the fixture turns recording on
    writer = Principal("w", (ns,), Role.writer)
    admin = Principal("x", (ns,), Role.admin)
    await append(services, writer, ns, "a", [turn("t1", "user", "u1 first words", user_id="u1")])
    keys_fixed = threading.Event()
    fix, threads_of = erasure_store.fix_user_keys, erasure_store.user_threads

    def fix_then_signal(*args: Any, **kwargs: Any) -> Any:
        got = fix(*args, **kwargs)
        keys_fixed.set()
        return got

    def land_then_read(ch: Any, namespace: str, user_id: str) -> Any:
        assert keys_fixed.wait(10)
        # Lands now, past every fence (as a row an earlier build or a replica wrote).
        ch.command(
            "INSERT INTO conversations SELECT * REPLACE ('m-late' AS msg_id, version + 1 AS version, "
            "'u1 landed late' AS content) FROM conversations WHERE namespace = {ns:String} "
            "AND user_id = 'u1' LIMIT 1",
            parameters={"ns": namespace},
        )
        return threads_of(ch, namespace, user_id)

    monkeypatch.setattr(erasure_store, "fix_user_keys", fix_then_signal)
    monkeypatch.setattr(erasure_store, "user_threads", land_then_read)
    req = await requesting.request(
        services, admin, user_id="u1", namespaces=None, namespace_list=None, purge=False
    )
    assert req.receipt.tables["conversations"].tombstoned == 2
    rows = turn_rows(services.ch, ns)
    assert {r["msg_id"] for r in rows if r["user_id"] == "u1" and r["tombstoned"]} >= {"m-late"}
    await requesting.run_removal(services, req.erasure_id)
    left = services.ch.query(
        "SELECT count() FROM conversations WHERE namespace = {ns:String} AND user_id = 'u1' "
        "SETTINGS apply_deleted_mask = 0",
        parameters={"ns": ns},
    ).result_rows[0][0]
    assert left == 0
