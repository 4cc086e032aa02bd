"""Fixtures of the brief tests: Services copies with their own settings and LLM (the
shared session fixture is never changed), principals, and an API over such a copy."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from loom.auth.principal import Principal, Role
from loom.providers.llm import LLM
from tests.providers.standin import StandInServer


@pytest.fixture
def make_svc(services: Any) -> Callable[..., Any]:
    """make_svc(llm=None, **settings) -> a Services copy sharing the backends."""

    def _make(llm: LLM | None = None, **settings: Any) -> Any:
        return dataclasses.replace(
            services,
            settings=services.settings.model_copy(update=settings),
            llm=llm or services.llm,
            extras={},
        )

    return _make


@pytest.fixture
def who() -> Callable[..., Principal]:
    """who(ns, role="writer", scope="all", user="", session="") -> a Principal."""

    def _who(
        ns: str, role: str = "writer", scope: str = "all", user: str = "", session: str = ""
    ) -> Principal:
        return Principal(secrets.token_hex(8), (ns,), Role[role], scope, user, session)

    return _who


@asynccontextmanager
async def api_over(svc: Any) -> AsyncIterator[httpx.AsyncClient]:
    from loom.api.app import create_app
    from tests.asgi import in_process

    async with in_process(create_app(svc)) as client:
        yield client


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        yield srv
