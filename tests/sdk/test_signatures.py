"""The SDK's methods are generated from the API's request models (loom/sdk/codegen.py):
the committed modules are what the generator writes now, every op has a method, and
each method's keyword parameters are its request's fields, with the model's required
fields required and its defaults, for the async Agent and the blocking SyncAgent alike."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest
from pydantic_core import PydanticUndefined

from loom.sdk import codegen, ops, sync_ops
from loom.sdk.agent import Agent
from loom.sdk.sync import SyncAgent

METHODS = [(group, method) for group in codegen.GROUPS for method in group.methods]


def test_the_committed_modules_are_what_the_generator_writes() -> None:
    stale = [path.name for path, text in codegen.generated().items() if path.read_text() != text]
    assert stale == [], f"{stale} are stale: run `python -m loom.sdk.codegen`"


def test_every_op_has_a_method() -> None:
    assert {m.op for _, m in METHODS} == set(codegen.route_docs())


def _expected(method: codegen.Method) -> dict[str, tuple[bool, Any]]:
    """Each field the method takes: (required, the default its signature shows)."""
    out = {}
    for name, info in method.request.model_fields.items():
        if (method.only and name not in method.only) or name in method.skip:
            continue
        if name in codegen.FROM_AGENT or info.default_factory is not None:
            out[name] = (False, None)
        else:
            required = info.default is PydanticUndefined
            out[name] = (required, None if required else info.default)
    return out


def _shown(fn: Any) -> dict[str, tuple[bool, Any]]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # after self
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), fn
    return {
        p.name: (p.default is inspect.Parameter.empty, None if p.default is p.empty else p.default)
        for p in params
    }


@pytest.mark.parametrize(("group", "method"), METHODS, ids=[f"{g.attr}.{m.name}" for g, m in METHODS])
def test_signatures_match_the_request_models(group: codegen.Group, method: codegen.Method) -> None:
    expected = _expected(method)
    for module in (ops, sync_ops):
        fn = getattr(getattr(module, group.cls), method.name)
        assert _shown(fn) == expected, (module.__name__, group.cls, method.name)
        hints = typing.get_type_hints(fn)  # every annotation resolves (sync: the Agent's method's)
        assert set(expected) <= set(hints), hints
        assert f"`{method.op}`" in (fn.__doc__ or "") and all(f"    {p}: " in fn.__doc__ for p in expected)


def test_both_agents_carry_every_group() -> None:
    bot = Agent("ns", "local", "bot", base_url="http://127.0.0.1:9", token="loom_x")
    for group in codegen.GROUPS:
        assert type(getattr(bot, group.attr)) is getattr(ops, group.cls)
        shown = inspect.getattr_static(SyncAgent, group.attr)  # documented: help(SyncAgent) lists it
        assert isinstance(shown, property) and group.doc in (shown.__doc__ or "")


def test_what_a_method_sends_is_what_the_caller_gave() -> None:
    """An argument left at its default is not sent (the API applies its own); one given is."""
    from loom.models import memory as m
    from loom.sdk.calls import request_body

    bot = Agent("ns-a", "local", "bot-a", base_url="http://127.0.0.1:9", token="loom_x")
    fields = {"namespace": None, "user_id": "u", "query": "q", "limit": 10, "as_of": None, "session_id": ""}
    assert request_body(bot, m.MemorySearchRequest, fields) == {
        "namespace": "ns-a",
        "user_id": "u",
        "query": "q",
    }
    fields |= {"limit": 3, "namespace": "ns-b"}
    assert request_body(bot, m.MemorySearchRequest, fields)["limit"] == 3
    assert request_body(bot, m.MemorySearchRequest, fields)["namespace"] == "ns-b"
