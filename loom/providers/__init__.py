"""Model providers (design §4): embedders and chat LLMs.

Importing this package is cheap: onnxruntime and the MiniLM model load on first use.
"""

from loom.providers.embedders import (
    EMBEDDER_KINDS,
    Embedder,
    EmbedderError,
    FakeEmbedder,
    MiniLMEmbedder,
    OpenAICompatEmbedder,
    SpyEmbedder,
    build_embedder,
)
from loom.providers.llm import (
    LLM,
    LLM_KINDS,
    ChatMessage,
    FakeLLM,
    LLMCall,
    LLMError,
    LLMNotConfigured,
    OpenAICompatLLM,
    ScriptedLLM,
    build_llm,
)

__all__ = [
    "EMBEDDER_KINDS",
    "LLM",
    "LLM_KINDS",
    "ChatMessage",
    "Embedder",
    "EmbedderError",
    "FakeEmbedder",
    "FakeLLM",
    "LLMCall",
    "LLMError",
    "LLMNotConfigured",
    "MiniLMEmbedder",
    "OpenAICompatEmbedder",
    "OpenAICompatLLM",
    "ScriptedLLM",
    "SpyEmbedder",
    "build_embedder",
    "build_llm",
]
