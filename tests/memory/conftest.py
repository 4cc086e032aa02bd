"""Fixtures of the memory tests: a Services copy with its own LLM, and an API over it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from loom.providers.llm import LLM


@pytest.fixture
def make_svc(services: Any) -> Callable[..., Any]:
    """make_svc(llm=None) -> a Services copy sharing the backends (and the inline embedder)."""

    def _make(llm: LLM | None = None) -> Any:
        return dataclasses.replace(services, llm=llm or services.llm)

    return _make


@asynccontextmanager
async def api_over(svc: Any) -> AsyncIterator[Callable[..., Any]]:
    from loom.api.app import create_app
    from tests.asgi import in_process

    async with in_process(create_app(svc)) as client:

        async def call(op: str, token: str, **body: Any) -> httpx.Response:
            return await client.post(f"/v1/{op}", json=body, headers={"Authorization": f"Bearer {token}"})

        yield call


def record_arg(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, position: int) -> list[Any]:
    """Wrap `module.name` so that each call appends its positional argument at
    `position` to the returned list (the call itself goes through unchanged)."""
    seen: list[Any] = []
    real = getattr(module, name)

    def recording(*args: Any, **kw: Any) -> Any:
        seen.append(args[position])
        return real(*args, **kw)

    monkeypatch.setattr(module, name, recording)
    return seen
