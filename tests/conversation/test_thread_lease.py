"""The thread lease (loom.leases.thread_lease, one per (namespace, thread_id)) is shared by
every writer of a thread's saved state: save, unsave, append's embedding write,
compaction's retirement and thread deletion. With the lease held from here, each of them
does its provider work (embedding, summary) and then waits: none answers or writes while
the lease is taken, and each finishes once it is free."""

from __future__ import annotations

import asyncio
from typing import Any

from loom.leases import Lease, thread_lease_key
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from tests.conversation.conftest import SUMMARY, wait_for
from tests.conversation.helpers import SAVE, emb_row, ok, save, turn_rows

UNSAVE = "conversation.unsave_message"
SAVED = "the ledger cutover is planned for Friday night"
APPENDED = "the invoices moved to the new ledger this morning"
GRACE_S = 0.3  # after a writer's provider work, ample for its few writes were it not waiting


def _rows(services: Any, ns: str, thread: str) -> list[dict[str, Any]]:
    return [r for r in turn_rows(services.ch, ns) if r["thread_id"] == thread]


async def _thread(call: Any, writer: str, ns: str, thread: str, n: int) -> None:
    turns = [
        {"thread_id": thread, "role": ("user", "assistant")[i % 2], "content": f"step {i} of the ledger move"}
        for i in range(n)
    ]
    await ok(call, "conversation.append", writer, namespace=ns, agent="a", turns=turns)


async def test_every_writer_of_a_thread_waits_for_its_lease(
    call, ns, writer, mint, services, summarizer, worker_embedder, api_embedder
):
    await save(call, writer, namespace=ns, conversation_id="t-unsave", content=SAVED)
    await _thread(call, writer, ns, "t-compact", 16)
    await _thread(call, writer, ns, "t-delete", 2)
    in_worker = worker_embedder(SpyEmbedder(FakeEmbedder()))
    in_api = api_embedder(SpyEmbedder(FakeEmbedder()))
    threads = ("t-save", "t-unsave", "t-append", "t-compact", "t-delete")
    held = [Lease(services.redis, thread_lease_key(ns, t)) for t in threads]
    for lease in held:
        assert await lease.try_acquire()
    try:
        writers = {
            "save": call(SAVE, writer, namespace=ns, user_id="alice", conversation_id="t-save", message_id="m",
                         role="user", content=SAVED),
            "unsave": call(UNSAVE, writer, namespace=ns, user_id="alice", conversation_id="t-unsave",
                           message_id="m"),
            "append": call("conversation.append", writer, namespace=ns, agent="a", thread_id="t-append",
                           msg_id="m", role="user", content=APPENDED),
            "compact": call("conversation.compact", writer, namespace=ns, agent="a", thread_id="t-compact"),
            "delete": call("conversation.delete", mint(ns, "admin"), namespace=ns, agent="a",
                           thread_id="t-delete", confirm_thread_id="t-delete"),
        }  # fmt: skip
        tasks = {name: asyncio.ensure_future(c) for name, c in writers.items()}

        async def provider_work_done() -> bool:
            return SAVED in in_api.texts and APPENDED in in_worker.texts and SUMMARY in in_worker.texts

        assert await wait_for(provider_work_done)
        done, _ = await asyncio.wait(tasks.values(), timeout=GRACE_S)
        assert [n for n, t in tasks.items() if t in done] == [], "answered while its thread's lease was held"
        assert _rows(services, ns, "t-save") == []
        assert [r["is_saved"] for r in _rows(services, ns, "t-unsave")] == [True]
        assert [r["msg_id"] for r in _rows(services, ns, "t-append")] == ["m"]  # the turn, not its vector
        assert emb_row(services.ch, ns, "t-append", "m") is None
        compacting = _rows(services, ns, "t-compact")
        assert len(compacting) == 16 and not any(r["tombstoned"] or r["is_summary"] for r in compacting)
        assert not any(r["tombstoned"] for r in _rows(services, ns, "t-delete"))
    finally:
        for lease in held:
            await lease.release()
    answers = {name: await t for name, t in tasks.items()}
    assert {n: a.status_code for n, a in answers.items()} == dict.fromkeys(writers, 200), answers
    assert answers["save"].json()["indexed"] is True
    assert [r["is_saved"] for r in _rows(services, ns, "t-save")] == [True]
    assert answers["unsave"].json() == {"found": True, "removed": True}
    assert _rows(services, ns, "t-unsave") == []
    assert answers["append"].json()["embedding"] == "embedded"
    assert answers["compact"].json()["messages_summarized"] == 6
    assert all(r["tombstoned"] for r in _rows(services, ns, "t-delete"))
