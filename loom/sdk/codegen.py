"""Writes the SDK's op methods from the API's request models: loom/sdk/ops.py (the
Agent's groups, async) and loom/sdk/sync_ops.py (SyncAgent's, blocking). Each method
takes the request's fields as keyword arguments, with their types, defaults and rules;
its docstring is the op's route docstring and each field's description, so an editor
completes and explains them and `help()` shows them.

    python -m loom.sdk.codegen          # write both files
    python -m loom.sdk.codegen --check  # exit 1 when they are not what this writes

Run it after changing a request model, a route's docstring or the table below;
tests/sdk/test_signatures.py fails while the committed files are stale. The table says
which op each method calls, its request and response models, and when a call is retried.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from loom.api import routes as routes_package
from loom.models import erasure as e
from loom.models import health as h
from loom.models import memory as m
from loom.models import memory_answers as ma
from loom.models import namespace as n
from loom.models import portability as pt
from loom.models import replicas as d
from loom.models import session as b
from loom.models import settings as st
from loom.models import webhook as w
from loom.models.conversation import lifecycle as k
from loom.models.conversation import reading as c
from loom.models.conversation import saved as s
from loom.models.conversation import search as q

HERE = Path(__file__).parent
ASYNC_FILE, SYNC_FILE = HERE / "ops.py", HERE / "sync_ops.py"
MODULES = {
    "b": b,
    "k": k,
    "c": c,
    "d": d,
    "e": e,
    "h": h,
    "m": m,
    "ma": ma,
    "n": n,
    "pt": pt,
    "s": s,
    "q": q,
    "st": st,
    "w": w,
}
ALIAS = {module.__name__: alias for alias, module in MODULES.items()}
FROM_AGENT = {"namespace": "the Agent's namespace", "agent": "the Agent's name"}
WIDTH = 98  # of a docstring's text, before its indentation


@dataclass(frozen=True)
class Method:
    name: str
    op: str
    request: type[BaseModel]
    response: type[BaseModel] | None  # None for a stream
    note: str = ""  # said first, before the route's docstring
    retry: str = "True"  # when a call is retried on 503: an expression over the arguments
    only: tuple[str, ...] = ()  # the request's fields it takes (default: every one)
    skip: tuple[str, ...] = ()  # ... or every one but these
    stream: bool = False  # the answer is NDJSON: an async iterator of its lines


@dataclass(frozen=True)
class Group:
    cls: str
    attr: str  # the Agent's attribute
    doc: str
    methods: tuple[Method, ...]
    extra: Mapping[str, str] = field(default_factory=dict)  # hand-written methods: name to ops.py's code


SAVED_AVAILABLE = '''
    async def available(self) -> bool:
        """Whether saving is open now: false while a replica of a rolling deploy could
        lose saved state (a save then answers 503 replica_lacks_capability). A client
        hides its "save" action while this is false."""
        shared = await self._op("replicas.show", d.ReplicasShowRequest, d.ReplicasShowResponse, {})
        return SAVED_STATE in shared.capabilities
'''

GROUPS: tuple[Group, ...] = (
    Group(
        "Conversation",
        "conversation",
        "The conversation plane: turns, threads, search, compaction, deletion.",
        (
            Method(
                "append",
                "conversation.append",
                c.AppendRequest,
                c.AppendResponse,
                "One turn (idempotent by msg_id: retried on 503).",
                skip=("turns",),
            ),
            Method(
                "append_batch",
                "conversation.append",
                c.AppendRequest,
                c.AppendBatchResponse,
                "`turns=[...]`, 1 to 500, one result each in order.",
                only=("namespace", "agent", "turns"),
            ),
            Method("search", "conversation.search", q.SearchRequest, q.SearchResponse),
            Method("create", "conversation.create", c.CreateRequest, c.CreateResponse),
            Method("update", "conversation.update", c.UpdateRequest, c.ThreadOut),
            Method("threads", "conversation.threads", c.ThreadsRequest, c.ThreadsResponse),
            Method("get", "conversation.get", c.GetRequest, c.GetResponse),
            Method("list", "conversation.list", c.ListRequest, c.ListResponse),
            Method("high_turns", "conversation.high_turns", c.HighTurnsRequest, c.HighTurnsResponse),
            Method("reembed", "conversation.reembed", c.ReembedRequest, c.ReembedResponse),
            Method("compact", "conversation.compact", k.CompactRequest, k.CompactResponse, retry="False"),
            Method(
                "compact_status",
                "conversation.compact_status",
                k.CompactStatusRequest,
                k.CompactStatusResponse,
            ),
            Method("delete", "conversation.delete", k.DeleteRequest, k.DeleteResponse),
            Method(
                "delete_message",
                "conversation.delete_message",
                k.DeleteMessageRequest,
                k.DeleteMessageResponse,
                "Remove one turn and every copy of it, with a receipt (idempotent).",
            ),
            Method("redact", "conversation.redact", k.RedactRequest, k.RedactResponse),
            Method("set_logging", "conversation.set_logging", k.SetLoggingRequest, n.NamespaceConfigResponse),
        ),
    ),
    Group(
        "Saved",
        "saved",
        "One user's saved messages.",
        (
            Method("save", "conversation.save_message", s.SaveRequest, s.SaveResponse),
            Method("unsave", "conversation.unsave_message", s.UnsaveRequest, s.UnsaveResponse),
            Method("list", "conversation.list_saved_messages", s.ListSavedRequest, s.ListSavedResponse),
            Method("status", "conversation.saved_status", s.SavedStatusRequest, s.SavedStatusResponse),
            Method(
                "search", "conversation.search_saved_messages", s.SearchSavedRequest, s.SearchSavedResponse
            ),
        ),
        extra={"available": SAVED_AVAILABLE},
    ),
    Group(
        "Memory",
        "memory",
        "Durable facts about a user, their evidence, the profile and context packs.",
        (
            Method("set", "memory.set", m.MemorySetRequest, m.MemorySetResponse, retry="False"),
            Method("search", "memory.search", m.MemorySearchRequest, m.MemorySearchResponse),
            Method("list", "memory.list", m.MemoryListRequest, m.MemoryListResponse),
            Method("delete", "memory.delete", m.MemoryDeleteRequest, m.MemoryDeleteResponse),
            Method(
                "history",
                "memory.history",
                m.MemoryHistoryRequest,
                m.MemoryHistoryResponse,
                "One fact's chain of versions, oldest to newest.",
            ),
            Method(
                "profile",
                "memory.profile",
                m.MemoryProfileRequest,
                m.MemoryProfileResponse,
                "The user's sectioned profile (rebuilt first when stale).",
            ),
            Method(
                "set_from_messages",
                "memory.set_from_messages",
                m.SetFromMessagesRequest,
                m.SetFromMessagesResponse,
                retry="False",
            ),
            Method("recall", "memory.recall", m.RecallRequest, m.RecallResponse),
            Method(
                "observe",
                "observe.record",
                m.ObserveRecordRequest,
                m.ObserveRecordResponse,
                "Idempotent (retried on 503) when `obs_id` is given.",
                retry="obs_id is not None",
            ),
            Method(
                "crystallize",
                "observe.crystallize",
                m.ObserveCrystallizeRequest,
                m.SetFromMessagesResponse,
                retry="False",
            ),
            Method("context_pack", "context.pack", m.ContextPackRequest, m.ContextPackResponse),
            Method(
                "search_all",
                "search",
                m.UnifiedSearchRequest,
                m.UnifiedSearchResponse,
                "The unified `search`: the user's memory and recorded conversations in one answer (never "
                "briefs: a brief does not compete with facts in recall).",
            ),
            Method(
                "ask",
                "memory.ask",
                ma.MemoryAskRequest,
                ma.MemoryAskResponse,
                "A question about the user, answered with citations (or, with no model, the ranked "
                "context and a `reason`).",
            ),
            Method(
                "job_status",
                "memory.job_status",
                ma.JobStatusRequest,
                ma.JobStatusResponse,
                "The state of a deferred set_from_messages (`job_id`).",
            ),
        ),
    ),
    Group(
        "Briefs",
        "briefs",
        "Session briefs: the resumable state of a line of work.",
        (
            Method(
                "save",
                "session.brief_save",
                b.BriefSaveRequest,
                b.BriefSaveResponse,
                "A retry of the same (session_id, event_cursor) writes nothing, so only such a save "
                "(or a compare-and-set one) is retried on 503.",
                retry="bool(event_cursor) or if_revision is not None",
            ),
            Method("get", "session.brief_get", b.BriefGetRequest, b.BriefGetResponse),
            Method("list", "session.brief_list", b.BriefListRequest, b.BriefListResponse),
            Method("delete", "session.brief_delete", b.BriefDeleteRequest, b.BriefDeleteResponse),
        ),
    ),
    Group(
        "Namespace",
        "namespaces",
        "The namespace's configuration.",
        (
            Method("get_config", "namespace.get_config", n.GetConfigRequest, n.NamespaceConfigResponse),
            Method("set_policy", "namespace.set_policy", n.SetPolicyRequest, n.NamespaceConfigResponse),
        ),
    ),
    Group(
        "Erasure",
        "erasure",
        "Erasing users and namespaces, exporting a user's rows, the retention in force.",
        (
            Method("request", "erasure.request", e.ErasureRequest, e.ErasureResponse),
            Method("status", "erasure.status", e.ErasureStatusRequest, e.ErasureResponse),
            Method("retention", "retention.show", e.RetentionShowRequest, e.RetentionShowResponse),
            Method(
                "export",
                "erasure.export",
                e.ExportRequest,
                None,
                "The user's rows as they stream (one dict per NDJSON line: a header, the rows, an "
                "`end` line), never held whole in memory.",
                stream=True,
            ),
        ),
    ),
    Group(
        "Portability",
        "portability",
        "Import and export (admin, a token not bound to one user): `loom import` and `loom export` drive them.",
        (
            Method("import_start", "import.start", pt.ImportStartRequest, pt.ImportJobOut),
            Method(
                "import_write",
                "import.write",
                pt.ImportWriteRequest,
                pt.ImportWriteResponse,
                "One batch (idempotent by its seq: retried on 503).",
            ),
            Method("import_status", "import.status", pt.ImportStatusRequest, pt.ImportStatusResponse),
            Method(
                "export",
                "export.start",
                pt.ExportStartRequest,
                None,
                "The export's lines as they stream (one dict per NDJSON line: the header, the rows, "
                "the end line), decompressed as they come, never held whole in memory.",
                stream=True,
            ),
        ),
    ),
    Group(
        "Ops",
        "ops",
        "The operator's views.",
        (
            Method(
                "health",
                "health.show",
                h.HealthShowRequest,
                h.HealthShowResponse,
                "The backends, the job queue, the embedding outcomes, the rates (admin).",
            ),
            Method(
                "replicas",
                "replicas.show",
                d.ReplicasShowRequest,
                d.ReplicasShowResponse,
                "What every live replica shares (and, for an admin, the replicas).",
            ),
        ),
    ),
    Group(
        "Settings",
        "settings",
        "The live settings (admin, a token not bound to one user).",
        (
            Method("get", "settings.get", st.SettingsGetRequest, st.SettingsResponse),
            Method("set", "settings.set", st.SettingsSetRequest, st.SettingsResponse),
        ),
    ),
    Group(
        "Webhooks",
        "webhooks",
        "The namespace's signed webhooks (admin, a token not bound to one user).",
        (
            Method(
                "register",
                "webhook.register",
                w.WebhookRegisterRequest,
                w.WebhookRegisterResponse,
                "The namespace's first registration answers its secret.",
                retry="False",
            ),
            Method("list", "webhook.list", w.WebhookListRequest, w.WebhookListResponse),
            Method("delete", "webhook.delete", w.WebhookDeleteRequest, w.WebhookDeleteResponse),
            Method(
                "rotate_secret",
                "webhook.rotate_secret",
                w.WebhookRotateRequest,
                w.WebhookRotateResponse,
                retry="False",
            ),
            Method(
                "deliveries",
                "webhook.deliveries",
                w.WebhookDeliveriesRequest,
                w.WebhookDeliveriesResponse,
                "The delivery log, newest attempt first.",
            ),
        ),
    ),
)


# -- a field as a parameter ----------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    annotation: str
    default: str | None  # source text; None: required
    doc: str


def params(method: Method) -> list[Param]:
    """The method's keyword parameters: the request's fields, required ones first."""
    fields = method.request.model_fields
    names = [x for x in fields if (not method.only or x in method.only) and x not in method.skip]
    out = [param(x, fields[x]) for x in names]
    return sorted(out, key=lambda p: p.default is not None)


def param(name: str, info: FieldInfo) -> Param:
    kind = annotation(info.annotation)
    if name in FROM_AGENT:
        return Param(name, "str | None", "None", f"Default: {FROM_AGENT[name]}.")
    doc = describe(info)
    if info.default_factory is not None:
        made = info.default_factory()  # type: ignore[call-arg]  # pydantic's factory may take the data; ours take none
        return Param(name, with_none(kind), "None", join(doc, f"Default: {made!r}."))
    if info.default is PydanticUndefined:
        return Param(name, kind, None, doc)
    return Param(name, kind, repr(info.default), doc)


def with_none(kind: str) -> str:
    return kind if kind.endswith("| None") or kind == "None" else f"{kind} | None"


def annotation(tp: Any) -> str:
    """A type as source text the generated module can evaluate (its imports)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return annotation(args[0])
    if tp is type(None):
        return "None"
    if origin in (Union, types.UnionType):
        parts = [annotation(a) for a in args]
        seen = list(dict.fromkeys(p for p in parts if p != "None"))
        return " | ".join(seen + (["None"] if "None" in parts else []))
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    # Sequence and Mapping: what the model accepts (any list or tuple, any mapping), and
    # no clash with a method named `list` in the class that declares it.
    if origin in (list, Sequence, tuple):
        return f"Sequence[{annotation(args[0])}]"
    if origin is dict:
        return f"Mapping[{annotation(args[0])}, {annotation(args[1])}]"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"{ALIAS[tp.__module__]}.{tp.__name__} | Mapping[str, Any]"
    if tp in (str, int, float, bool, datetime):
        return str(tp.__name__)
    if tp is Any:
        return "Any"
    raise TypeError(f"no source text for the type {tp!r}: teach loom.sdk.codegen.annotation")


def describe(info: FieldInfo) -> str:
    """The field's description and rules, from its own metadata and that of the types
    its annotation is built of."""
    texts = [info.description or ""]
    metadata: list[Any] = list(info.metadata)
    for meta in _inner_metadata(info.annotation):
        if isinstance(meta, FieldInfo):
            texts.append(meta.description or "")
            metadata.extend(meta.metadata)
        else:
            metadata.append(meta)
    said = next((t for t in texts if t), "")
    rules = _rules(metadata, _unit(info.annotation))
    choices = _choices(info.annotation)
    return join(said, f"One of {choices}." if choices and not said else "", f"{rules}." if rules else "")


def _inner_metadata(tp: Any) -> Iterable[Any]:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        yield from args[1:]
        yield from _inner_metadata(args[0])
    elif origin in (Union, types.UnionType):
        for a in args:
            yield from _inner_metadata(a)


def _base(tp: Any) -> Any:
    """The type a field holds, without its metadata and its None."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _base(args[0])
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return _base(kept[0]) if len(kept) == 1 else tp
    return tp


def _unit(tp: Any) -> str:
    base = _base(tp)
    kind = get_origin(base) or base
    return {str: "characters", list: "items", dict: "keys"}.get(kind, "")


def _choices(tp: Any) -> str:
    base = _base(tp)
    return ", ".join(repr(a) for a in get_args(base)) if get_origin(base) is Literal else ""


def _rules(metadata: Iterable[Any], unit: str) -> str:
    low: Any = None
    high: Any = None
    out: list[str] = []
    for meta in metadata:
        if isinstance(meta, MinLen) and meta.min_length:
            low = meta.min_length
        elif isinstance(meta, MaxLen):
            high = meta.max_length
        elif isinstance(meta, Ge):
            low = meta.ge
        elif isinstance(meta, Le):
            high = meta.le
        elif isinstance(meta, Gt):
            out.append(f"above {meta.gt:,}")
        elif isinstance(meta, Lt):
            out.append(f"below {meta.lt:,}")
        elif getattr(meta, "pattern", None):
            out.append(f"matching {meta.pattern}")
    suffix = f" {unit}" if unit else ""
    if low is not None and high is not None:
        out.insert(0, f"{low:,} to {high:,}{suffix}")
    elif low is not None:
        out.insert(0, f"at least {low:,}{suffix}")
    elif high is not None:
        out.insert(0, f"at most {high:,}{suffix}")
    text = "; ".join(dict.fromkeys(out))
    return text[:1].upper() + text[1:]


def join(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


# -- docstrings ------------------------------------------------------------------------------


def route_docs() -> dict[str, str]:
    """Each op's route docstring (what the API's OpenAPI page says of it), read from the
    route modules (not the app: it imports the dashboard, which imports this SDK)."""
    out: dict[str, str] = {}
    for info in pkgutil.walk_packages(routes_package.__path__, f"{routes_package.__name__}."):
        if info.ispkg:
            continue
        router = importlib.import_module(info.name).router
        for route in router.routes:
            if isinstance(route, APIRoute) and route.path.startswith("/v1/"):
                out[route.path.removeprefix("/v1/")] = inspect.cleandoc(route.endpoint.__doc__ or "")
    return out


def docstring(method: Method, params_: list[Param], routes: dict[str, str], indent: str) -> str:
    said = join(method.note, routes.get(method.op, ""))
    head = textwrap.fill(f"`{method.op}`: {' '.join(said.split())}", WIDTH)
    lines = [head]
    if params_:
        lines += ["", "Args:"]
        for p in params_:
            said = p.doc or ("Required." if p.default is None else f"Default {p.default}.")
            body = textwrap.fill(f"{p.name}: {said}", WIDTH - 4, subsequent_indent="    ")
            lines += ["    " + line for line in body.splitlines()]
    text = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return textwrap.indent(f'"""{text}\n"""', indent).lstrip()


# -- the two modules -------------------------------------------------------------------------

HEADER = '''"""{doc}

GENERATED by loom/sdk/codegen.py from the API's request models: do not edit; change the
models (or the table in codegen.py) and run `python -m loom.sdk.codegen`.
"""

from __future__ import annotations

{imports}
'''

MODEL_IMPORTS = "\n".join(
    "from {} import {} as {}".format(*module.__name__.rsplit(".", 1), alias)
    for alias, module in MODULES.items()
)


def model_name(model: type[BaseModel] | None) -> str:
    assert model is not None, "a method that is no stream names its response model"
    return f"{ALIAS[model.__module__]}.{model.__name__}"


def signature(params_: list[Param]) -> str:
    if not params_:
        return "self"
    parts = [
        f"{p.name}: {p.annotation}" + (f" = {p.default}" if p.default is not None else "") for p in params_
    ]
    return "self, *, " + ", ".join(parts)


def arguments(params_: list[Param]) -> str:
    return "{" + ", ".join(f'"{p.name}": {p.name}' for p in params_) + "}"


def async_method(method: Method, routes: dict[str, str]) -> str:
    ps = params(method)
    doc = docstring(method, ps, routes, " " * 8)
    req = model_name(method.request)
    if method.stream:
        return (
            f"    async def {method.name}({signature(ps)}) -> AsyncIterator[dict[str, Any]]:\n"
            f"        {doc}\n"
            f'        async for row in self._lines("{method.op}", {req}, {arguments(ps)}):\n'
            f"            yield row\n"
        )
    resp = model_name(method.response)
    retry = "" if method.retry == "True" else f", idempotent={method.retry}"
    return (
        f"    async def {method.name}({signature(ps)}) -> {resp}:\n"
        f"        {doc}\n"
        f'        return await self._op("{method.op}", {req}, {resp}, {arguments(ps)}{retry})\n'
    )


def sync_method(group: Group, name: str, stream: bool = False) -> str:
    """SyncAgent's method: the Agent's, wrapped (its signature and docstring are kept)."""
    wrap = "iterating" if stream else "blocking"
    return f"    {name} = {wrap}(ops.{group.cls}.{name})\n"


def render_async(routes: dict[str, str]) -> str:
    out = HEADER.format(
        doc="Every op as a typed method of the Agent's groups (`bot.conversation`, `bot.saved`,\n"
        "`bot.memory`, `bot.briefs`, `bot.erasure`, `bot.namespaces`, `bot.ops`, `bot.settings`,\n"
        "`bot.webhooks`): its keyword arguments are the op's request fields, checked by the\n"
        "API's own edge model before a round trip; the answer is parsed into its response\n"
        "model. `namespace` and `agent` default to the Agent's.",
        imports="from collections.abc import AsyncIterator, Mapping, Sequence\nfrom datetime import datetime\n"
        "from typing import Any, Literal\n\n" + MODEL_IMPORTS + "\nfrom loom.sdk.calls import Group\n",
    )
    out += '\n# What every replica of a deploy must declare before a save is taken (loom.replicas).\nSAVED_STATE = "saved_state_preserved_in_compaction"\n'
    for group in GROUPS:
        out += f'\n\nclass {group.cls}(Group):\n    """{group.doc}"""\n'
        for method in group.methods:
            out += "\n" + async_method(method, routes)
        out += "".join(group.extra.values())
    out += "\n\n__all__ = [" + ", ".join(f'"{g.cls}"' for g in GROUPS) + ', "SAVED_STATE"]\n'
    return out


def render_sync() -> str:
    out = HEADER.format(
        doc="SyncAgent's groups: the Agent's op methods (loom/sdk/ops.py), each call blocking.",
        imports="from typing import TYPE_CHECKING\n\n"
        "from loom.sdk import ops\nfrom loom.sdk.calls import Runner, SyncGroup, blocking, iterating\n\n"
        "if TYPE_CHECKING:\n    from loom.sdk.agent import Agent\n",
    )
    for group in GROUPS:
        out += f'\n\nclass {group.cls}(SyncGroup):\n    """{group.doc}"""\n\n'
        out += "".join(sync_method(group, m.name, m.stream) for m in group.methods)
        out += "".join(sync_method(group, name) for name in group.extra)
    out += (
        '\n\nclass Groups:\n    """The Agent\'s groups, each call blocking (SyncAgent\'s attributes)."""\n\n'
    )
    out += "    def __init__(self, agent: Agent, runner: Runner) -> None:\n"
    out += "".join(f"        self._{g.attr} = {g.cls}(agent.{g.attr}, runner)\n" for g in GROUPS)
    for g in GROUPS:
        out += f'\n    @property\n    def {g.attr}(self) -> {g.cls}:\n        """{g.doc} (`help(bot.{g.attr})`: its methods.)"""\n'
        out += f"        return self._{g.attr}\n"
    return out


def formatted(source: str, path: Path) -> str:
    """The source as `ruff format` and ruff's import sorting leave it (the repository's style)."""
    ruff = [sys.executable, "-m", "ruff"]
    fixed = subprocess.run(
        [*ruff, "check", "--select", "I,F401", "--fix", "--quiet", "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
    ).stdout
    done = subprocess.run(
        [*ruff, "format", "--stdin-filename", str(path), "-"],
        input=fixed or source,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def generated() -> dict[Path, str]:
    routes = route_docs()
    return {
        ASYNC_FILE: formatted(render_async(routes), ASYNC_FILE),
        SYNC_FILE: formatted(render_sync(), SYNC_FILE),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loom.sdk.codegen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed files are stale")
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run python -m loom.sdk.codegen)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated().items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
