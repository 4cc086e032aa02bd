"""Where an op lives (docs/architecture.md, "Adding an op"), checked for every op the API
serves: its op module under loom/ops, its route and request model files named for its
prefix's plane, its policy entry, tests in the folder mirroring its op module, and its
MCP listing or the reason it has none."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from loom.api.app import create_app
from loom.api.observe import flat_routes
from loom.auth import policy
from loom.mcp_server.tools import NOT_LISTED, SPECS

TESTS = Path(__file__).resolve().parents[1]

# An op's name is `<prefix>.<name>`; its prefix belongs to a plane, which names its route
# and model files (loom/api/routes/<plane>..., loom/models/<plane>...). A prefix is its
# own plane unless listed here.
PLANE_OF_PREFIX = {
    "observe": "memory",
    "context": "memory",
    "search": "memory",
    "retention": "erasure",
    "import": "portability",
    "export": "portability",
}


@dataclass(frozen=True)
class Op:
    name: str
    route: APIRoute

    @property
    def plane(self) -> str:
        prefix = self.name.split(".")[0]
        return PLANE_OF_PREFIX.get(prefix, prefix)


def _served() -> list[Op]:
    app = create_app()
    found = []
    for entry in flat_routes(list(app.routes)):
        route = getattr(entry, "original_route", entry)
        path = getattr(entry, "path", "") or ""
        if isinstance(route, APIRoute) and path.startswith("/v1/"):
            found.append(Op(path.removeprefix("/v1/"), route))
    return found


OPS = _served()


def _in_plane(module: str, root: str, plane: str) -> str | None:
    """The module's place in the plane (`reading` of loom.models.conversation.reading,
    `answers` of loom.models.memory_answers, '' of loom.models.memory), or None when it is
    not the plane's."""
    rest = module.removeprefix(root + ".")
    if rest == plane:
        return ""
    for sep in (".", "_"):
        if rest.startswith(plane + sep):
            return rest.removeprefix(plane + sep)
    return None


def _callees(fn: Callable[..., Any]) -> list[Any]:
    """What the function calls by a module-level name (`f(...)`, `module.f(...)`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names: dict[str, Any] = fn.__globals__
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            out.append(names.get(f.id))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base = names.get(f.value.id)
            if isinstance(base, types.ModuleType):
                out.append(getattr(base, f.attr, None))
    return out


def _op_module(op: Op) -> str:
    for callee in _callees(op.route.endpoint):
        module = getattr(callee, "__module__", None) or ""
        if module.startswith("loom.ops."):
            return module
    raise AssertionError(f"{op.name}: its route calls no function of loom.ops")


def _request_models(op: Op) -> list[type]:
    hint = typing.get_type_hints(op.route.endpoint)["body"]
    return [m for m in typing.get_args(hint) or (hint,) if isinstance(m, type)]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_an_op_lives_where_its_name_says(op: Op) -> None:
    route_at = _in_plane(op.route.endpoint.__module__, "loom.api.routes", op.plane)
    assert route_at is not None, (
        f"{op.name}: its route is in {op.route.endpoint.__module__}, not the {op.plane} plane's"
    )
    for model in _request_models(op):
        model_at = _in_plane(model.__module__, "loom.models", op.plane)
        assert model_at == route_at, (
            f"{op.name}: {model.__name__} is in {model.__module__}, not beside its route"
        )
    policy.rule_for(op.name)  # raises when the op has no policy entry
    listed = {spec.op for spec in SPECS}
    assert (op.name in listed) != (op.name in NOT_LISTED), (
        f"{op.name}: on an MCP listing or in NOT_LISTED, not both"
    )


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_an_op_is_tested_beside_its_op_module(op: Op) -> None:
    package = _op_module(op).removeprefix("loom.ops.").split(".")[:-1]
    folder = TESTS.joinpath(*package)
    named = re.compile(rf"""(["']|/v1/){re.escape(op.name)}["']""")
    assert any(named.search(p.read_text()) for p in folder.rglob("test_*.py")), (
        f"{op.name}: no test in tests/{'/'.join(package)} calls it"
    )


def test_every_unlisted_op_says_why_and_is_served() -> None:
    served = {op.name for op in OPS}
    assert set(NOT_LISTED) <= served
    assert all(len(why) > 20 for why in NOT_LISTED.values())


def test_the_rule_sees_a_route_in_another_planes_file() -> None:
    assert _in_plane("loom.api.routes.erasure", "loom.api.routes", "conversation") is None
    assert (
        _in_plane("loom.api.routes.conversation.lifecycle", "loom.api.routes", "conversation") == "lifecycle"
    )
    assert _in_plane("loom.models.memory_answers", "loom.models", "memory") == "answers"
    assert _in_plane("loom.models.memory", "loom.models", "memory") == ""
