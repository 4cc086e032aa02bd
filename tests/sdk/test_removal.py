"""The SDK's conversation.redact and conversation.delete_message: typed receipts, and a
bad request refused before it is sent."""

from __future__ import annotations

from typing import Any

import pytest

from loom import Agent, LoomError


@pytest.fixture
async def bot(api_url: str, arq_worker: Any, ns: str, mint: Any) -> Any:
    async with Agent(ns, "staging", "support-bot", base_url=api_url, token=mint(ns, "admin")) as agent:
        yield agent


async def test_redact_then_delete_one_message(bot: Agent) -> None:
    await bot.conversation.set_logging(enabled=True)
    got = await bot.conversation.append(thread_id="t", role="user", content="the ferry leaves at nine sharp")
    red = await bot.conversation.redact(thread_id="t", msg_id=got.msg_id, spans=["nine sharp"])
    assert red.redacted and red.spans == 1 and red.placeholder == "[redacted]"
    turns = (await bot.conversation.list(thread_id="t")).messages
    assert [t.content for t in turns] == ["the ferry leaves at [redacted]"]
    gone = await bot.conversation.delete_message(thread_id="t", msg_id=got.msg_id)
    assert gone.deleted and gone.tables["conversations"].written == 1
    assert (await bot.conversation.list(thread_id="t")).messages == []
    with pytest.raises(LoomError) as err:
        await bot.conversation.redact(thread_id="t", msg_id=got.msg_id, placeholder="")
    assert (err.value.status, err.value.field) == (422, "placeholder")
