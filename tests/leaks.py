"""Every provider as a spy that fails the test when it is sent text that reads as high.

Loom's privacy rule: text that reads as high (loom.sensitivity.reads_as_high) never
reaches a provider: an embedder (the API's inline one for search queries and saves, the
workers' for appends and re-embeds), the LLM (brief revisions; later the titler, the
summarizer, the extractor). The ``leak_spy`` fixture (tests/conftest.py) wraps every
provider in :data:`PROVIDERS` for one test and fails it, at teardown, if any of them was
sent such a text; the test may also call :meth:`LeakSpy.assert_clean` itself.

The providers are injected where Loom holds them (``Services.llm``, the inline
embedder of ``loom.ops.embedding.inline``, the worker's
``workers.embed_jobs.set_embedder``), never patched.

Adding a provider (a new feature's model): write a :class:`ProviderSlot` whose
``install`` wraps it with the spy and returns how to undo that, and add it with
:func:`register`. Adding an op that can reach a provider: add a driver to
``tests/test_provider_leaks.py``'s ``DRIVERS``.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.sensitivity import reads_as_high


@dataclass(frozen=True)
class Leak:
    """One text that reads as high, as a provider received it (its digest, not the text:
    a failing test's report must not print it either)."""

    provider: str
    length: int
    digest: str


@dataclass
class LeakSpy:
    leaks: list[Leak] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)  # texts each provider received
    llm: LeakSpyLLM | None = None  # the spy around Services.llm (set by its slot)

    def check(self, provider: str, texts: Iterable[str]) -> None:
        for text in texts:
            self.seen[provider] = self.seen.get(provider, 0) + 1
            if text and reads_as_high(text):
                self.leaks.append(Leak(provider, len(text), hashlib.sha256(text.encode()).hexdigest()[:12]))

    def assert_clean(self) -> None:
        assert not self.leaks, f"text that reads as high reached a provider: {self.leaks}"


class LeakSpyEmbedder:
    """An embedder that shows the spy every text before its inner embedder embeds it."""

    def __init__(self, inner: Any, spy: LeakSpy, provider: str) -> None:
        self.inner, self.spy, self.provider = inner, spy, provider

    def __getattr__(self, name: str) -> Any:  # model_id, dim, vector, ...
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> Any:
        self.spy.check(self.provider, list(texts))
        return self.inner.embed(texts)

    def embed_query(self, texts: Sequence[str]) -> Any:
        from loom.providers.embedders import query_vectors

        self.spy.check(self.provider, list(texts))
        return query_vectors(self.inner, texts)


class LeakSpyLLM:
    """An LLM that shows the spy every message before its inner LLM answers. A test that
    needs answers sets ``inner`` (e.g. a loom.providers.llm.ScriptedLLM)."""

    def __init__(self, inner: Any, spy: LeakSpy, provider: str) -> None:
        self.inner, self.spy, self.provider = inner, spy, provider

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def configured(self) -> bool:
        return bool(self.inner.configured)

    async def complete(self, messages: Sequence[Any], **kwargs: Any) -> str:
        self.spy.check(self.provider, [m.content for m in messages])
        answer = self.inner.complete(messages, **kwargs)
        return str(await answer if inspect.isawaitable(answer) else answer)


Undo = Callable[[], None]


@dataclass(frozen=True)
class Env:
    """Where the providers live: the API process's Services and the in-process worker's."""

    services: Any
    worker_services: Any = None


@dataclass(frozen=True)
class ProviderSlot:
    """Where one provider lives: ``install(env, spy)`` wraps it and returns the undo."""

    name: str
    install: Callable[[Env, LeakSpy], Undo]


def _inline_embedder(env: Env, spy: LeakSpy) -> Undo:
    from loom.ops.embedding import inline

    svc = env.services
    previous = inline.install(svc, None)
    inner = previous if previous is not None else inline.current(svc)
    inline.install(svc, LeakSpyEmbedder(inner, spy, "embedder:api"))
    return lambda: inline.install(svc, previous)


def _worker_embedder(env: Env, spy: LeakSpy) -> Undo:
    from workers import embed_jobs

    inner = embed_jobs.current_embedder()
    embed_jobs.set_embedder(LeakSpyEmbedder(inner, spy, "embedder:worker"))
    return lambda: embed_jobs.set_embedder(inner)


def _llm(env: Env, spy: LeakSpy) -> Undo:
    svc = env.services
    inner = svc.llm
    svc.llm = spy.llm = LeakSpyLLM(inner, spy, "llm:api")

    def undo() -> None:
        svc.llm = inner
        spy.llm = None

    return undo


def _worker_llm(env: Env, spy: LeakSpy) -> Undo:
    """The worker process's LLM (the jobs' models: titler, summarizer, extractor); it
    answers as the API's spy does, so a test scripts one model for both."""
    svc = env.worker_services
    if svc is None or svc is env.services:
        return lambda: None
    inner = svc.llm

    class _Shared(LeakSpyLLM):
        @property
        def configured(self) -> bool:
            return bool((spy.llm.inner if spy.llm is not None else self.inner).configured)

        async def complete(self, messages: Sequence[Any], **kwargs: Any) -> str:
            self.spy.check(self.provider, [m.content for m in messages])
            target = spy.llm.inner if spy.llm is not None else self.inner
            answer = target.complete(messages, **kwargs)
            return str(await answer if inspect.isawaitable(answer) else answer)

    svc.llm = _Shared(inner, spy, "llm:worker")

    def undo() -> None:
        svc.llm = inner

    return undo


PROVIDERS: list[ProviderSlot] = [
    ProviderSlot("embedder:api", _inline_embedder),
    ProviderSlot("embedder:worker", _worker_embedder),
    ProviderSlot("llm:api", _llm),
    ProviderSlot("llm:worker", _worker_llm),
]


def register(slot: ProviderSlot) -> None:
    """Add a provider (a later feature's titler, summarizer, extractor model)."""
    if all(s.name != slot.name for s in PROVIDERS):
        PROVIDERS.append(slot)


def install_all(env: Env, spy: LeakSpy) -> list[Undo]:
    return [slot.install(env, spy) for slot in PROVIDERS]
