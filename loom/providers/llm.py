"""Chat-model providers (design §4).

* :class:`FakeLLM` — the product default: ``configured`` is False and every call raises
  :class:`LLMNotConfigured`, so features that need a model report that none is set up.
* :class:`OpenAICompatLLM` — ``POST {base_url}/v1/chat/completions`` over httpx.AsyncClient.
* :class:`ScriptedLLM` — a configured, scriptable fake for tests that records its calls.

``build_llm(kind, **opts)`` makes one from settings (LOOM_LLM=fake|openai).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, Unpack, runtime_checkable

import httpx

from loom.providers._http import auth_headers, endpoint, json_body, request_failure


def json_object(reply: str) -> dict[str, Any]:
    """The JSON object of a model's reply (a model may wrap it in prose or a code fence)."""
    match = re.search(r"\{.*\}", reply, re.S)
    if match is None:
        raise ValueError("the model's reply holds no JSON object")
    data = json.loads(match.group(0))
    if not isinstance(data, dict):
        raise ValueError("the model's reply is not a JSON object")
    return data


__all__ = [
    "LLM",
    "LLM_KINDS",
    "ChatMessage",
    "FakeLLM",
    "LLMCall",
    "LLMError",
    "LLMNotConfigured",
    "LAST_USAGE",
    "OpenAICompatLLM",
    "ScriptedLLM",
    "build_llm",
]

LLM_KINDS = ("fake", "openai")


# The token counts the provider reported for the last completion the current task
# awaited: (prompt_tokens, completion_tokens), or None when it reported none. A
# context variable, so concurrent callers each read their own call's counts.
LAST_USAGE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "loom_llm_usage", default=None
)


class LLMError(Exception):
    """The chat model failed (network, HTTP error, timeout, malformed response)."""


class LLMNotConfigured(LLMError):
    """No chat model is configured (LOOM_LLM=fake)."""


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@runtime_checkable
class LLM(Protocol):
    name: str
    configured: bool

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> str:
        """The assistant's reply text. Raises LLMError (LLMNotConfigured when there is no model)."""
        ...


# -- the built-in kinds' complete() ---------------------------------------------------


@dataclass(frozen=True)
class LLMCall:
    """One call of complete(): what every built-in kind answers, and a ScriptedLLM records."""

    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0


class _Options(TypedDict, total=False):
    """complete()'s keyword arguments (LLM's), with LLMCall's defaults."""

    model: str | None
    max_tokens: int | None
    temperature: float


class _Answering:
    """complete() for the built-in kinds: its arguments, as one LLMCall, go to the kind's _answer."""

    async def complete(self, messages: Sequence[ChatMessage], **options: Unpack[_Options]) -> str:
        return await self._answer(LLMCall(list(messages), **options))

    async def _answer(self, call: LLMCall) -> str:
        raise NotImplementedError


# -- the stock fake ----------------------------------------------------------------


class FakeLLM(_Answering):
    """No model: ``configured`` is False and :meth:`complete` raises LLMNotConfigured."""

    name = "fake"
    configured = False

    async def _answer(self, call: LLMCall) -> str:
        raise LLMNotConfigured(
            "no LLM is configured (LOOM_LLM=fake); set LOOM_LLM=openai, LOOM_LLM_URL and LOOM_LLM_MODEL"
        )

    def __repr__(self) -> str:
        return "FakeLLM()"


# -- the scripted fake for tests ------------------------------------------------------


Script = Sequence[str | BaseException] | Callable[[list[ChatMessage]], Any]


@dataclass
class ScriptedLLM(_Answering):
    """A configured fake: answers from a list (in order) or a function of the messages.

    List items that are exceptions are raised instead of answered; running out of
    answers raises LLMError. A function may return a str (or an awaitable of one) or
    raise. Every call is recorded in ``calls`` before it is answered.
    """

    responses: Script
    name: str = "scripted"
    configured: bool = True
    calls: list[LLMCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: list[str | BaseException] | None = (
            None if callable(self.responses) else list(self.responses)
        )
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        """Scripted answers not yet used (0 for a function script)."""
        return len(self._queue) if self._queue is not None else 0

    async def _answer(self, call: LLMCall) -> str:
        with self._lock:
            self.calls.append(call)
            if self._queue is not None:
                if not self._queue:
                    raise LLMError(f"ScriptedLLM ran out of responses after {len(self.calls) - 1} calls")
                item: Any = self._queue.pop(0)
        if self._queue is None:
            assert callable(self.responses)
            item = self.responses(call.messages)
            if inspect.isawaitable(item):
                item = await item
        if isinstance(item, BaseException):
            raise item
        if not isinstance(item, str):
            raise LLMError(f"ScriptedLLM script produced {type(item).__name__}, not str")
        return item


# -- OpenAI-compatible chat -----------------------------------------------------------


class OpenAICompatLLM(_Answering):
    """Chat completions over the OpenAI protocol (one reused httpx.AsyncClient per event loop)."""

    name = "openai"
    configured = True

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.url = endpoint(base_url, "chat/completions")
        self.model = model or None
        self.timeout = float(timeout)
        self._api_key = api_key or None
        # One client per event loop: an AsyncClient's connections belong to the loop that
        # opened them, and callers may run us from several loops (asyncio.run in threads).
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._clients_lock = threading.Lock()

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                client = httpx.AsyncClient(
                    timeout=httpx.Timeout(self.timeout), headers=auth_headers(self._api_key)
                )
                self._clients[loop] = client
        return client

    async def _answer(self, call: LLMCall) -> str:
        use_model = call.model or self.model
        if not use_model:
            raise LLMError("no chat model given: set LOOM_LLM_MODEL or pass model=")
        payload: dict[str, Any] = {
            "model": use_model,
            "messages": [m.to_dict() for m in call.messages],
            "temperature": call.temperature,
        }
        if call.max_tokens is not None:
            payload["max_tokens"] = call.max_tokens
        where = f"LLM {use_model!r} at {self.url}"
        try:
            resp = await self._http().post(self.url, json=payload)
        except httpx.HTTPError as exc:
            raise LLMError(request_failure(exc, where, self.timeout)) from exc
        body = json_body(resp, where, LLMError)
        content = self._content(body, where)
        LAST_USAGE.set(self._usage(body))
        return content

    @staticmethod
    def _usage(body: dict[str, Any]) -> tuple[int, int] | None:
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not (isinstance(prompt, int) and isinstance(completion, int) and prompt > 0 and completion > 0):
            return None
        return prompt, completion

    @staticmethod
    def _content(body: Any, where: str) -> str:
        if not isinstance(body, dict):
            raise LLMError(f"{where}: malformed response, expected a JSON object")
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise LLMError(f"{where}: malformed response, no 'choices'")
        first = choices[0]
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            raise LLMError(f"{where}: malformed response, choices[0] has no 'message'")
        content = message.get("content")
        if not isinstance(content, str):
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                raise LLMError(f"{where}: the model refused: {refusal[:200]}")
            raise LLMError(
                f"{where}: malformed response, choices[0].message.content is {type(content).__name__}"
            )
        return content

    async def aclose(self) -> None:
        """Close the client of the running event loop (clients of other loops die with them)."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    def __repr__(self) -> str:
        return f"OpenAICompatLLM(url={self.url!r}, model={self.model!r})"


_REMOTE_ONLY = {"base_url", "model", "api_key", "timeout"}
_ALIASES = {"url": "base_url", "timeout_seconds": "timeout"}


def build_llm(kind: str, **opts: Any) -> LLM:
    """An LLM of ``kind`` ("fake" or "openai").

    Options: ``url``/``base_url``, ``model`` (the default model), ``api_key``,
    ``timeout``/``timeout_seconds``. ``None`` or ``""`` count as unset; "fake" ignores
    them all; "openai" needs ``url``. Unknown kinds and option names raise ValueError.
    """
    key = (kind or "").strip().lower()
    args: dict[str, Any] = {}
    for name, value in opts.items():
        if value is None or value == "":
            continue
        name = _ALIASES.get(name, name)
        if name not in _REMOTE_ONLY:
            raise ValueError(
                f"unknown option {name!r} for build_llm; accepted: url, model, api_key, timeout_seconds"
            )
        args[name] = value
    if key == "fake":
        return FakeLLM()
    if key == "openai":
        if "base_url" not in args:
            raise ValueError("the 'openai' LLM needs url (LOOM_LLM_URL)")
        return OpenAICompatLLM(**args)
    raise ValueError(f"unknown LLM kind {kind!r}; expected one of {', '.join(LLM_KINDS)}")
