"""build_embedder / build_llm, as settings will call them."""

from __future__ import annotations

import numpy as np
import pytest

from loom.providers import (
    FakeEmbedder,
    FakeLLM,
    MiniLMEmbedder,
    OpenAICompatEmbedder,
    OpenAICompatLLM,
    build_embedder,
    build_llm,
)
from tests.providers.standin import StandInServer


def settings_opts(url: str = "", model: str = "", key: str = "", timeout: float = 10.0) -> dict:
    """What the lead passes, straight from Settings (empty strings mean unset)."""
    return {"url": url, "model": model, "api_key": key, "timeout_seconds": timeout}


def test_build_minilm_ignores_connection_settings() -> None:
    e = build_embedder("minilm", **settings_opts(), intra_op_num_threads=1)
    assert isinstance(e, MiniLMEmbedder)
    assert e.intra_op_num_threads == 1 and not e.loaded


def test_build_fake() -> None:
    e = build_embedder("FAKE", **settings_opts(), dim=8)
    assert isinstance(e, FakeEmbedder) and e.dim == 8
    assert build_embedder("fake").model_id == "fake-hash-384"


def test_build_openai(standin: StandInServer) -> None:
    e = build_embedder("openai", **settings_opts(standin.url, "m", "k", 3.0))
    assert isinstance(e, OpenAICompatEmbedder)
    assert e.timeout == 3.0 and e.url == standin.url + "/v1/embeddings"
    v = e.embed(["x"])
    assert np.isclose(np.linalg.norm(v), 1.0)
    assert standin.requests[0].bearer == "k"


def test_build_embedder_errors() -> None:
    with pytest.raises(ValueError, match="unknown embedder kind"):
        build_embedder("bert")
    with pytest.raises(ValueError, match="LOOM_EMBEDDER_URL.*LOOM_EMBEDDER_MODEL"):
        build_embedder("openai", **settings_opts())
    with pytest.raises(ValueError, match="unknown option 'threads'"):
        build_embedder("minilm", threads=4)


async def test_build_llm(standin: StandInServer) -> None:
    assert isinstance(build_llm("fake", **settings_opts(timeout=60)), FakeLLM)
    llm = build_llm("openai", **settings_opts(standin.url + "/v1", "chat-m", "", 5))
    assert isinstance(llm, OpenAICompatLLM)
    assert llm.model == "chat-m" and llm.timeout == 5
    assert llm.url == standin.url + "/v1/chat/completions"
    from loom.providers import ChatMessage

    assert await llm.complete([ChatMessage("user", "hi")]) == "stand-in reply to: hi"
    with pytest.raises(ValueError, match="LOOM_LLM_URL"):
        build_llm("openai")
    with pytest.raises(ValueError, match="unknown LLM kind"):
        build_llm("anthropic")
    with pytest.raises(ValueError, match="unknown option"):
        build_llm("fake", temperature=1)
