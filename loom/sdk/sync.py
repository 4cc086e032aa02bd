"""A blocking facade for scripts: `SyncAgent` has the Agent's groups and methods, each
called without `await` (their signatures and docstrings are the Agent's:
loom/sdk/sync_ops.py, generated with loom/sdk/ops.py).

    from loom import SyncAgent

    with SyncAgent("dev", "local", "script", base_url="http://127.0.0.1:7777") as bot:
        hits = bot.conversation.search(query="where do invoices go?")
        for row in bot.erasure.export(user_id="u-7"):
            ...

The Agent lives on an event loop in a thread of its own; each call is run there and
waited for. An async iterator (erasure.export) becomes a plain iterator.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

from loom.models.conversation.reading import AppendBatchResponse
from loom.models.memory import ContextPackResponse, SetFromMessagesResponse
from loom.sdk.agent import FLUSH_EVERY, Agent, Session
from loom.sdk.sync_ops import Groups
from loom.sdk.transport import Connection

T = TypeVar("T")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="loom-sdk", daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result()

    def iterate(self, stream: AsyncIterator[T]) -> Iterator[T]:
        while True:
            try:
                yield self.run(stream.__anext__())
            except StopAsyncIteration:
                return

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class SyncAgent(Groups):
    """`Agent(namespace, environment, name, **options)` (loom.sdk.agent), blocking."""

    def __init__(self, namespace: str, environment: str, name: str, **options: Unpack[Connection]) -> None:
        self._runner = _Loop()

        async def build() -> Agent:  # the Agent's HTTP client belongs to the runner's loop
            return Agent(namespace, environment, name, **options)

        self.agent = self._runner.run(build())
        self.namespace, self.environment, self.name = namespace, environment, name
        super().__init__(self.agent, self._runner)

    def session(
        self, thread_id: str, *, user_id: str = "", session_id: str = "", flush_every: int = FLUSH_EVERY
    ) -> SyncSession:
        """This agent in thread `thread_id` for `user_id` (Agent.session), blocking."""
        made = self.agent.session(thread_id, user_id=user_id, session_id=session_id, flush_every=flush_every)
        return SyncSession(made, self._runner)

    def close(self) -> None:
        self._runner.run(self.agent.aclose())
        self._runner.stop()

    def __enter__(self) -> SyncAgent:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncSession:
    """A Session (loom.sdk.agent), blocking."""

    def __init__(self, session: Session, runner: _Loop) -> None:
        self.session, self._runner = session, runner

    @property
    def transcript_stored(self) -> bool | None:
        return self.session.transcript_stored

    def resume(
        self, query: str = "", *, token_budget: int = 4000, brief_key: str = ""
    ) -> ContextPackResponse:
        """context.pack for this scope (Session.resume)."""
        return self._runner.run(self.session.resume(query, token_budget=token_budget, brief_key=brief_key))

    def append(self, *turns: Mapping[str, Any]) -> AppendBatchResponse:
        """Write `turns` to the thread (Session.append)."""
        return self._runner.run(self.session.append(*turns))

    def flush(self) -> SetFromMessagesResponse | None:
        """Hand the buffered turns to extraction now (Session.flush)."""
        return self._runner.run(self.session.flush())

    def close(self) -> SetFromMessagesResponse | None:
        """Flush; the session takes no more appends (Session.close)."""
        return self._runner.run(self.session.close())

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._runner.run(self.session.__aexit__(kind, exc, tb))  # closes it unless closed
