"""A blocking facade for scripts: `SyncAgent` has the Agent's methods, each called
without `await`.

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
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from loom.sdk.agent import Agent

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


class _Blocking:
    """`target`'s coroutine methods as blocking ones; its other attributes wrapped the
    same way (the Agent's op groups, a Session)."""

    def __init__(self, target: Any, runner: _Loop) -> None:
        self._target, self._runner = target, runner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.isasyncgenfunction(value):
            return lambda *a, **kw: self._runner.iterate(value(*a, **kw))
        if inspect.iscoroutinefunction(value):
            return self._blocking(value)
        if callable(value):  # e.g. Agent.session: a plain method answering an object to wrap
            return lambda *a, **kw: _Blocking(value(*a, **kw), self._runner)
        if isinstance(value, str | int | float | bool | type(None)):
            return value
        return _Blocking(value, self._runner)

    def _blocking(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
        return lambda *a, **kw: self._runner.run(fn(*a, **kw))


class SyncAgent(_Blocking):
    def __init__(self, namespace: str, environment: str, name: str, **options: Any) -> None:
        runner = _Loop()

        async def build() -> Agent:  # the Agent's HTTP client belongs to the runner's loop
            return Agent(namespace, environment, name, **options)

        super().__init__(runner.run(build()), runner)

    def close(self) -> None:
        self._runner.run(self._target.aclose())
        self._runner.stop()

    def __enter__(self) -> SyncAgent:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
