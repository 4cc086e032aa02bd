"""`Agent`: one agent of one namespace, talking to a Loom API; `Session`: that agent in
one thread for one user.

    from loom import Agent

    async with Agent("dev", "local", "support-bot", base_url="http://localhost:7777") as bot:
        s = bot.session("thread-42", user_id="u1")
        resumed = await s.resume(query="resume the billing migration")
        await s.append({"role": "user", "content": "We moved invoices to the new ledger."})
        await s.close()

`Agent(namespace, environment, name)`:
- `namespace`: the namespace every call goes to (unless a call names another);
- `environment`: where the agent runs ("local", "staging", "prod"...), recorded on every
  turn the agent appends (its metadata's `environment`), so one namespace can tell a
  developer's runs from production's;
- `name`: the agent's name, the `agent` of its turns, threads and briefs.
The token comes from `token=` or LOOM_TOKEN, the API's address from `base_url=` or
LOOM_URL (default http://127.0.0.1:7777).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Unpack

from loom.models.conversation.reading import AppendBatchResponse
from loom.models.memory import ContextPackResponse, SetFromMessagesResponse
from loom.sdk.ops import (
    Briefs,
    Conversation,
    Erasure,
    Memory,
    Namespace,
    Ops,
    Portability,
    Saved,
    Settings,
    Webhooks,
)
from loom.sdk.transport import Connection, Transport

FLUSH_EVERY = 10  # turns buffered before they go to memory.set_from_messages


class Agent:
    def __init__(
        self,
        namespace: str,
        environment: str,
        name: str,
        **connection: Unpack[Connection],
    ) -> None:
        self.namespace, self.environment, self.name = namespace, environment, name
        self.transport = Transport(**connection)
        self.conversation = Conversation(self)
        self.saved = Saved(self)
        self.memory = Memory(self)
        self.briefs = Briefs(self)
        self.erasure = Erasure(self)
        self.namespaces = Namespace(self)
        self.ops = Ops(self)
        self.settings = Settings(self)
        self.webhooks = Webhooks(self)
        self.portability = Portability(self)

    def session(
        self,
        thread_id: str,
        *,
        user_id: str = "",
        session_id: str = "",
        flush_every: int = FLUSH_EVERY,
    ) -> Session:
        """This agent in thread `thread_id` for `user_id`; `session_id` scopes its memory
        (default: the thread)."""
        return Session(
            self, thread_id, user_id=user_id, session_id=session_id or thread_id, flush_every=flush_every
        )

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Session:
    """Appends go to the transcript at once and, every `flush_every` turns, to
    memory.set_from_messages (deferred: extraction runs on the worker pool), whether or
    not the namespace records transcripts; close() sends what is left."""

    def __init__(
        self, agent: Agent, thread_id: str, *, user_id: str, session_id: str, flush_every: int
    ) -> None:
        if flush_every < 1:
            raise ValueError("flush_every must be at least 1")
        self.agent, self.thread_id, self.user_id, self.session_id = agent, thread_id, user_id, session_id
        self.flush_every = flush_every
        self.transcript_stored: bool | None = None  # None until the first append answers
        self._buffer: list[dict[str, Any]] = []
        self._closed = False

    async def resume(
        self, query: str = "", *, token_budget: int = 4000, brief_key: str = ""
    ) -> ContextPackResponse:
        """context.pack for this scope: the user's relevant facts, this thread's transcript
        tail (when recorded), evidence hits; a brief only when `brief_key` names one."""
        return await self.agent.memory.context_pack(
            user_id=self.user_id or None,
            session_id=self.session_id,
            thread_id=self.thread_id,
            query=query,
            token_budget=token_budget,
            brief_key=brief_key,
        )

    async def append(self, *turns: Mapping[str, Any]) -> AppendBatchResponse:
        """Write `turns` ({role, content} and optionally msg_id, metadata, run_id, ...) to
        the thread; `transcript_stored` then says whether the namespace records."""
        self._check_open()
        sent = [self._turn(t) for t in turns]
        answer = await self.agent.conversation.append_batch(turns=sent)
        self.transcript_stored = all(r.reason != "logging_disabled" for r in answer.results)
        for turn, result in zip(sent, answer.results, strict=True):
            self._buffer.append({"role": turn["role"], "content": turn["content"], "msg_id": result.msg_id})
        if len(self._buffer) >= self.flush_every:
            await self.flush()
        return answer

    async def flush(self) -> SetFromMessagesResponse | None:
        """Hand the buffered turns to extraction now (None when nothing is buffered)."""
        if not self._buffer:
            return None
        messages, self._buffer = self._buffer, []
        try:
            return await self.agent.memory.set_from_messages(
                user_id=self.user_id or None, session_id=self.session_id, messages=messages, defer=True
            )
        except BaseException:
            self._buffer = messages + self._buffer  # nothing lost: the next flush sends them
            raise

    async def close(self) -> SetFromMessagesResponse | None:
        """Flush the buffered turns to extraction; the session takes no more appends."""
        out = await self.flush()
        self._closed = True
        return out

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._closed:
            await self.close()

    def _turn(self, turn: Mapping[str, Any]) -> dict[str, Any]:
        out = {"thread_id": self.thread_id, **turn}
        if self.user_id:
            out.setdefault("user_id", self.user_id)
        out["metadata"] = {"environment": self.agent.environment, **dict(turn.get("metadata") or {})}
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the session is closed")
