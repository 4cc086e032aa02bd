"""The chat providers: the stock fake, the scripted fake, and the OpenAI-compatible client."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from loom.providers import (
    LLM,
    ChatMessage,
    FakeLLM,
    LLMError,
    LLMNotConfigured,
    OpenAICompatLLM,
    ScriptedLLM,
)
from tests.providers.standin import Reply, StandInServer

MSGS = [ChatMessage("system", "be brief"), ChatMessage("user", "summarise the session")]


def make(srv: StandInServer, **kw: object) -> OpenAICompatLLM:
    opts: dict = {"base_url": srv.url, "model": "chat-default", "timeout": 2.0}
    opts.update(kw)
    return OpenAICompatLLM(**opts)


async def test_fake_llm_is_not_configured() -> None:
    llm = FakeLLM()
    assert isinstance(llm, LLM)
    assert llm.name == "fake" and llm.configured is False
    with pytest.raises(LLMNotConfigured, match="no LLM is configured"):
        await llm.complete(MSGS)
    assert issubclass(LLMNotConfigured, LLMError)


async def test_scripted_llm_list() -> None:
    llm = ScriptedLLM(["first", RuntimeError("boom"), "third"])
    assert llm.configured is True and isinstance(llm, LLM)
    assert await llm.complete(MSGS, model="m1", max_tokens=5) == "first"
    with pytest.raises(RuntimeError, match="boom"):
        await llm.complete(MSGS)
    assert await llm.complete([ChatMessage("user", "x")], temperature=0.5) == "third"
    with pytest.raises(LLMError, match="ran out"):
        await llm.complete(MSGS)
    assert len(llm.calls) == 4
    assert llm.calls[0].messages == MSGS
    assert (llm.calls[0].model, llm.calls[0].max_tokens) == ("m1", 5)
    assert llm.calls[2].temperature == 0.5


async def test_scripted_llm_function() -> None:
    llm = ScriptedLLM(lambda msgs: f"{len(msgs)} messages, last: {msgs[-1].content}")
    assert await llm.complete(MSGS) == "2 messages, last: summarise the session"
    assert llm.calls[0].messages == MSGS


async def test_good_answer_and_what_was_sent(standin: StandInServer) -> None:
    llm = make(standin, api_key="sk-chat")
    assert llm.name == "openai" and llm.configured is True and isinstance(llm, LLM)
    out = await llm.complete(MSGS, max_tokens=100)
    assert out == "stand-in reply to: summarise the session"
    (req,) = standin.requests
    assert req.path == "/v1/chat/completions"
    assert req.json == {
        "model": "chat-default",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "summarise the session"},
        ],
        "temperature": 0.0,
        "max_tokens": 100,
    }
    assert req.bearer == "sk-chat"
    await llm.aclose()


async def test_model_override_is_sent(standin: StandInServer) -> None:
    llm = make(standin)
    await llm.complete(MSGS, model="other-model", temperature=0.7)
    await llm.complete(MSGS)
    first, second = (r.json for r in standin.requests)
    assert first["model"] == "other-model" and first["temperature"] == 0.7
    assert "max_tokens" not in first  # omitted when not given
    assert second["model"] == "chat-default"


async def test_no_model_anywhere(standin: StandInServer) -> None:
    with pytest.raises(LLMError, match="no chat model"):
        await make(standin, model=None).complete(MSGS)
    assert await make(standin, model=None).complete(MSGS, model="m") != ""


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (Reply.malformed(), "not valid JSON"),
        (Reply.json({"id": "x"}), "no 'choices'"),
        (Reply.json({"choices": []}), "no 'choices'"),
        (Reply.json({"choices": [{"index": 0}]}), "has no 'message'"),
        (
            Reply.json({"choices": [{"message": {"role": "assistant", "content": None}}]}),
            "content is NoneType",
        ),
        (Reply.json({"choices": [{"message": {"content": None, "refusal": "no way"}}]}), "refused: no way"),
        (Reply.json("just a string"), "expected a JSON object"),
    ],
)
async def test_malformed(standin: StandInServer, reply: Reply, match: str) -> None:
    standin.enqueue(standin.CHAT, reply)
    with pytest.raises(LLMError, match=match):
        await make(standin).complete(MSGS)


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500])
async def test_http_errors(standin: StandInServer, status: int) -> None:
    standin.enqueue(standin.CHAT, Reply.error(status, f"nope {status}"))
    with pytest.raises(LLMError, match=f"HTTP {status}.*nope {status}") as info:
        await make(standin).complete(MSGS)
    assert not isinstance(info.value, LLMNotConfigured)


async def test_timeout(standin: StandInServer) -> None:
    standin.enqueue(standin.CHAT, standin.chat_ok("too late").delayed(5))
    llm = make(standin, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(LLMError, match="timed out after 0.3s"):
        await llm.complete(MSGS)
    assert time.monotonic() - t0 < 3
    assert await llm.complete(MSGS) == "stand-in reply to: summarise the session"


async def test_concurrent_calls(standin: StandInServer) -> None:
    standin.set_handler(
        standin.CHAT, lambda req: standin.chat_ok(req.json["messages"][-1]["content"]).delayed(0.2)
    )
    llm = make(standin)
    t0 = time.monotonic()
    outs = await asyncio.gather(*(llm.complete([ChatMessage("user", f"q{i}")]) for i in range(5)))
    assert outs == [f"q{i}" for i in range(5)]
    assert time.monotonic() - t0 < 0.9  # they overlapped


def test_usable_from_another_event_loop(standin: StandInServer) -> None:
    llm = make(standin)
    assert asyncio.run(llm.complete(MSGS)).startswith("stand-in")
    assert asyncio.run(llm.complete(MSGS)).startswith("stand-in")  # a new loop: a new client
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(llm.complete(MSGS))))
    t.start()
    t.join()
    assert out and out[0].startswith("stand-in")


async def test_reuses_one_client_per_loop(standin: StandInServer) -> None:
    llm = make(standin)
    await llm.complete(MSGS)
    first = llm._http()
    await llm.complete(MSGS)
    assert llm._http() is first
    await llm.aclose()
    assert first.is_closed
    assert await llm.complete(MSGS) != ""  # a fresh client after aclose
    await llm.aclose()
