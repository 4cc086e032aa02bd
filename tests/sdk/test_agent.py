"""The SDK's Agent and Session against the API on a real HTTP port (the suite's
backends and worker): sessions, typed ops, errors, streaming export, the sync facade."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loom import Agent, LoomError, SyncAgent
from loom.models.conversation.search import SearchResponse


@pytest.fixture
async def bot(api_url: str, arq_worker: Any, ns: str, mint: Any) -> Any:
    async with Agent(ns, "staging", "support-bot", base_url=api_url, token=mint(ns, "admin")) as agent:
        yield agent


async def _turns(bot: Agent, thread_id: str) -> list[Any]:
    return (await bot.conversation.list(thread_id=thread_id)).messages


async def test_a_session_writes_the_transcript_and_hands_turns_to_extraction(bot: Agent) -> None:
    await bot.conversation.set_logging(enabled=True)
    s = bot.session("t-1", user_id="u1", flush_every=3)
    await s.append({"role": "user", "content": "We moved invoices to the new ledger."})
    await s.append({"role": "assistant", "content": "Noted; I'll update the export job.", "msg_id": "a-1"})
    assert s.transcript_stored is True
    turns = await _turns(bot, "t-1")
    assert [(t.role, t.user_id, t.metadata) for t in turns] == [
        ("user", "u1", {"environment": "staging"}),
        ("assistant", "u1", {"environment": "staging"}),
    ]
    assert await _turns(bot, "t-1") == turns  # the agent's own thread: listed as support-bot's
    assert turns[1].msg_id == "a-1"
    recall = {"user_id": "u1", "query": "invoices ledger export"}
    assert (await bot.memory.recall(**recall)).hits == []  # two turns buffered, flush_every is 3

    await s.append({"role": "user", "content": "Refunds stay on the old ledger until March."})
    held = {h.content for h in (await bot.memory.recall(**recall)).hits}
    assert "We moved invoices to the new ledger." in held and len(held) == 3

    await s.append({"role": "user", "content": "The credit notes move in April."})
    assert await s.close() is not None  # the fourth turn goes to extraction at close
    april = await bot.memory.recall(user_id="u1", query="credit notes April")
    assert [h.content for h in april.hits] == ["The credit notes move in April."]
    with pytest.raises(RuntimeError):
        await s.append({"role": "user", "content": "too late"})

    resumed = await bot.session("t-1", user_id="u1").resume(query="where do invoices go?")
    tail = next(sec for sec in resumed.sections if sec.name == "transcript")
    assert "user: The credit notes move in April." in [i.text for i in tail.items]


async def test_transcript_stored_is_false_where_the_namespace_does_not_record(bot: Agent) -> None:
    async with bot.session("t-2", user_id="u2") as s:
        answer = await s.append({"role": "user", "content": "hello"})
        assert s.transcript_stored is False and answer.results[0].reason == "logging_disabled"
    assert await _turns(bot, "t-2") == []


async def test_ops_are_typed_and_checked_before_sending(bot: Agent) -> None:
    found = await bot.conversation.search(query="anything")
    assert isinstance(found, SearchResponse) and found.namespaces == [bot.namespace]
    with pytest.raises(LoomError) as err:
        await bot.conversation.search(query="anything", limit=0)
    assert (err.value.status, err.value.error, err.value.field) == (422, "invalid_request", "limit")
    with pytest.raises(LoomError) as err:
        await bot.briefs.get(brief_key="no-such-brief")
    assert (err.value.status, err.value.error) == (404, "not_found")


async def test_the_servers_refusal_is_raised_with_its_code(
    api_url: str, arq_worker: Any, ns: str, mint: Any
) -> None:
    async with Agent(ns, "local", "reader", base_url=api_url, token=mint(ns, "viewer")) as viewer:
        with pytest.raises(LoomError) as err:
            await viewer.conversation.append(thread_id="t", role="user", content="hi")
    assert (err.value.status, err.value.error) == (403, "forbidden")


async def test_briefs_save_get_list_delete(bot: Agent) -> None:
    saved = await bot.briefs.save(project="billing", branch="ledger-move", sections={"goal": "Move invoices"})
    assert saved.brief_key == "auto/billing/ledger-move"
    assert (await bot.briefs.get(project="billing")).sections.goal == "Move invoices"
    assert [b.brief_key for b in (await bot.briefs.list()).briefs] == ["auto/billing/ledger-move"]
    assert (await bot.briefs.delete(brief_key=saved.brief_key)).deleted is True


async def test_export_streams_rows_and_the_sync_facade_blocks(
    api_url: str, bot: Agent, ns: str, mint: Any
) -> None:
    await bot.conversation.set_logging(enabled=True)
    async with bot.session("t-3", user_id="u3") as s:
        await s.append({"role": "user", "content": "one"}, {"role": "assistant", "content": "two"})
    rows = [row async for row in bot.erasure.export(user_id="u3", namespaces=[ns])]
    assert rows[0]["kind"] == "export" and rows[-1] == {"kind": "end", "rows": len(rows) - 2}
    assert sorted(r["content"] for r in rows if r["kind"] == "turn") == ["one", "two"]

    def blocking() -> tuple[list[str], int]:
        with SyncAgent(ns, "local", "support-bot", base_url=api_url, token=mint(ns, "admin")) as sync_bot:
            turns = sync_bot.conversation.list(thread_id="t-3").messages
            exported = list(sync_bot.erasure.export(user_id="u3", namespaces=[ns]))
            return [t.content for t in turns], len(exported)

    contents, exported = await asyncio.to_thread(blocking)  # the worker keeps this loop
    assert contents == ["one", "two"] and exported == len(rows)


async def test_saving_is_available_when_every_replica_keeps_saved_state(bot: Agent) -> None:
    from loom import replicas

    assert await bot.saved.available() is True
    assert replicas.SAVED_STATE == "saved_state_preserved_in_compaction"  # the SDK's own copy


async def test_ops_health_answers_the_health_figures(bot: Agent) -> None:
    health = await bot.ops.health()
    assert health.status == "ok" and health.backends.clickhouse == "ok" and health.backends.redis == "ok"
    assert health.queue is not None and health.queue.name == "loom:queue"
    assert health.embeddings.rows == [] and health.rates.window_s >= 0


async def test_live_settings_get_and_set(bot: Agent) -> None:
    name = "LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS"
    try:
        changed = await bot.settings.set(values={name: 300})
        assert {s.name: (s.value, s.source) for s in changed.settings}[name] == (300, "override")
        shown = {s.name: s for s in (await bot.settings.get()).settings}
        assert (shown[name].value, shown[name].source, shown[name].type) == (300, "override", "int")
        with pytest.raises(LoomError) as err:
            await bot.settings.set(values={name: 0})
        assert (err.value.status, err.value.field, err.value.rule) == (
            422,
            f"values.{name}",
            "greater_than_equal",
        )
    finally:
        cleared = await bot.settings.set(values={name: None})
    assert {s.name: s.source for s in cleared.settings}[name] == "default"
