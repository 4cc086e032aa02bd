"""What every SDK method does (loom/sdk/ops.py and sync_ops.py are generated from the
request models by loom/sdk/codegen.py and call only this): the request checked by the
API's own edge model before it is sent, the answer parsed into the response model."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from loom.sdk.transport import LoomError, Transport

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
G = TypeVar("G", bound="Group")
P = ParamSpec("P")


class Agent(Protocol):
    """What a group of ops reads of its Agent (loom.sdk.agent, which builds the groups)."""

    namespace: str
    name: str
    transport: Transport


# Fields a method fills from its Agent when the caller leaves them out (None).
FROM_AGENT = ("namespace", "agent")


def request_body(agent: Agent, model: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (a method's keyword arguments) checked by the API's request model, with
    the Agent's namespace and name where the model has them and the caller gave none; as
    the JSON the API reads. An argument left at its default is not sent: the API applies
    its own default, as for a body that leaves the field out."""
    body = {name: value for name, value in fields.items() if not _default(model, name, value)}
    for name, value in zip(FROM_AGENT, (agent.namespace, agent.name), strict=True):
        if name in model.model_fields and body.get(name) is None:
            body[name] = value
    try:
        checked = model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise LoomError(422, "invalid_request", first["msg"], field, first["type"]) from None
    return checked.model_dump(mode="json", exclude_unset=True)


def _default(model: type[BaseModel], name: str, value: Any) -> bool:
    """Whether `value` is what the method's signature defaults `name` to: the model's
    default, or None for a field whose default the model builds (a list, a dict)."""
    field = model.model_fields.get(name)
    if field is None or name in FROM_AGENT:
        return False
    if field.default_factory is not None:
        return value is None
    if field.is_required():
        return False
    default = field.default
    return value is default or (type(value) is type(default) and value == default)


class Group:
    """One group of ops (`bot.conversation`, `bot.memory`, ...) of an Agent."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def _op(
        self,
        op: str,
        request: type[BaseModel],
        response: type[R],
        fields: dict[str, Any],
        *,
        idempotent: bool = True,
    ) -> R:
        """Call `op`; `idempotent`: retried on 503 and connection errors."""
        body = request_body(self._agent, request, fields)
        answer = await self._agent.transport.call(op, body, idempotent=idempotent)
        return response.model_validate(answer)

    async def _lines(
        self, op: str, request: type[BaseModel], fields: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """Call `op`, whose answer is NDJSON: each line as it arrives."""
        body = request_body(self._agent, request, fields)
        async for row in self._agent.transport.stream_lines(op, body):
            yield row


class Runner(Protocol):
    """Runs the Agent's coroutines for SyncAgent (loom.sdk.sync)."""

    def run(self, awaitable: Awaitable[T]) -> T: ...

    def iterate(self, stream: AsyncIterator[T]) -> Iterator[T]: ...


class SyncGroup:
    """One group of ops of a SyncAgent: the Agent's group, each call waited for."""

    def __init__(self, group: Any, runner: Runner) -> None:
        self._group, self._runner = group, runner


def blocking(method: Callable[Concatenate[G, P], Awaitable[T]]) -> Callable[Concatenate[SyncGroup, P], T]:
    """The Agent's `method` as a SyncGroup's, waited for: the same parameters (for mypy
    and an editor, through P) and docstring (for `help()`), one body for every op."""

    @functools.wraps(method)
    def call(self: SyncGroup, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._runner.run(method(self._group, *args, **kwargs))

    return call


def iterating(
    method: Callable[Concatenate[G, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncGroup, P], Iterator[T]]:
    """The Agent's streaming `method` as a SyncGroup's: a plain iterator of its lines."""

    @functools.wraps(method)
    def call(self: SyncGroup, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._runner.iterate(method(self._group, *args, **kwargs))

    call.__annotations__ = {**call.__annotations__, "return": Iterator[Any]}
    return call
