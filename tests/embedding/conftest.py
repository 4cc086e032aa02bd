"""The embedding tests run on the conversation plane's fixtures (tests/conversation/conftest.py):
the real endpoint, Redis and an in-process arq worker."""

from tests.conversation.conftest import (  # noqa: F401
    _conversation_runtime,
    api_embedder,
    other_services,
    recording,
    standin,
    summarizer,
    writer,
)
