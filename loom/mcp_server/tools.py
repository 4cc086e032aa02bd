"""The MCP tools: each is one op, its input schema the op's own request model.

Two listings. The default **core** one holds what an agent needs to remember and
resume: the unified search (`loom_search`: the user's memory and the namespace's
recorded conversations), memory, context and briefs. It does not hold
conversation.append, and no description asks a model to log turns: turns are captured
by a client's transcript hook. **all** (`?toolset=all`, or `loom mcp --toolset all`)
lists every other op, `loom_conversation_append` included.

conversation.search is on no listing: agents get its results as the conversation
section of `loom_search`. Over HTTP a listing holds only the tools the caller's token
may call (loom.auth.policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from loom.models import erasure as e
from loom.models import memory as m
from loom.models import memory_answers as ma
from loom.models import namespace as n
from loom.models import replicas as d
from loom.models import session as b
from loom.models.conversation import lifecycle as k
from loom.models.conversation import reading as c
from loom.models.conversation import saved as s

Toolset = Literal["core", "all"]
TOOLSETS: tuple[Toolset, ...] = ("core", "all")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    op: str
    request: type[BaseModel]
    description: str
    core: bool = False

    def input_schema(self) -> dict[str, Any]:
        return self.request.model_json_schema()

    @property
    def takes_run(self) -> bool:
        """Its writes can join the MCP session's run."""
        return "run_id" in self.request.model_fields or self.op == "conversation.append"


def _spec(op: str, request: type[BaseModel], description: str, *, core: bool = False) -> ToolSpec:
    return ToolSpec("loom_" + op.replace(".", "_"), op, request, description, core)


def _core(op: str, request: type[BaseModel], description: str) -> ToolSpec:
    """A tool of the core listing (and so of every listing)."""
    return _spec(op, request, description, core=True)


SPECS: tuple[ToolSpec, ...] = (
    # core
    _core(
        "search",
        m.UnifiedSearchRequest,
        "Search what Loom holds for a question: the user's memory and the namespace's recorded "
        "conversations, in one answer.",
    ),
    _core("memory.search", m.MemorySearchRequest, "Find a user's durable facts by meaning and words."),
    _core("memory.set", m.MemorySetRequest, "Remember durable facts about a user (a key revises one)."),
    _core("memory.list", m.MemoryListRequest, "Page through a user's facts, newest first."),
    _core("memory.delete", m.MemoryDeleteRequest, "Forget facts by id."),
    _core(
        "context.pack",
        m.ContextPackRequest,
        "What is needed to resume a user's work within a token budget: relevant facts, the thread's "
        "recent transcript, evidence; a brief only when named.",
    ),
    _core(
        "session.brief_save",
        b.BriefSaveRequest,
        "Save or revise a session brief (the state of a line of work).",
    ),
    _core("session.brief_get", b.BriefGetRequest, "Load a session brief by key, session or project."),
    _core("session.brief_list", b.BriefListRequest, "List the namespace's session briefs, newest first."),
    # all
    _spec("conversation.append", c.AppendRequest, "Append a turn (or a batch) to a thread's transcript."),
    _spec("conversation.create", c.CreateRequest, "Create a thread."),
    _spec("conversation.update", c.UpdateRequest, "Change a thread's title, metadata or run."),
    _spec("conversation.threads", c.ThreadsRequest, "List threads, newest first."),
    _spec("conversation.get", c.GetRequest, "Read one thread."),
    _spec("conversation.list", c.ListRequest, "Read a thread's turns in order."),
    _spec("conversation.compact", k.CompactRequest, "Summarise a thread's older turns."),
    _spec("conversation.compact_status", k.CompactStatusRequest, "The state of a deferred compaction."),
    _spec("conversation.delete", k.DeleteRequest, "Delete a thread (admin)."),
    _spec("conversation.delete_message", k.DeleteMessageRequest, "Remove one message and every copy of it."),
    _spec("conversation.redact", k.RedactRequest, "Replace spans of one message with a placeholder (admin)."),
    _spec("conversation.reembed", c.ReembedRequest, "Rebuild a namespace's vectors (admin)."),
    _spec(
        "conversation.high_turns",
        c.HighTurnsRequest,
        "List turns that read as high sensitivity (ids and kinds, never text; admin).",
    ),
    _spec("conversation.set_logging", k.SetLoggingRequest, "Switch transcript recording on or off (admin)."),
    _spec("conversation.save_message", s.SaveRequest, "Save a message for a user."),
    _spec("conversation.unsave_message", s.UnsaveRequest, "Unsave a user's message."),
    _spec("conversation.list_saved_messages", s.ListSavedRequest, "List a user's saved messages."),
    _spec("conversation.saved_status", s.SavedStatusRequest, "Whether messages are saved for a user."),
    _spec("conversation.search_saved_messages", s.SearchSavedRequest, "Search a user's saved messages."),
    _spec(
        "memory.set_from_messages", m.SetFromMessagesRequest, "Keep messages as evidence and extract facts."
    ),
    _spec("memory.recall", m.RecallRequest, "Read a user's evidence by words or time."),
    _spec("memory.history", m.MemoryHistoryRequest, "One fact's versions over time, oldest first."),
    _spec("memory.profile", m.MemoryProfileRequest, "A user's short profile, in sections."),
    _spec(
        "memory.ask",
        ma.MemoryAskRequest,
        "Ask a plain-language question about a user; answered from their memory with citations.",
    ),
    _spec("memory.job_status", ma.JobStatusRequest, "The state of a deferred memory extraction."),
    _spec("observe.record", m.ObserveRecordRequest, "Record a tool action as an observation."),
    _spec("observe.crystallize", m.ObserveCrystallizeRequest, "Extract facts from a run's observations."),
    _spec("session.brief_delete", b.BriefDeleteRequest, "Delete a session brief."),
    _spec("namespace.get_config", n.GetConfigRequest, "A namespace's recording and policy."),
    _spec("namespace.set_policy", n.SetPolicyRequest, "Set a namespace's extraction policy (admin)."),
    _spec("erasure.request", e.ErasureRequest, "Erase a user's data (admin)."),
    _spec("erasure.status", e.ErasureStatusRequest, "An erasure's progress and receipt."),
    _spec("replicas.show", d.ReplicasShowRequest, "What every live replica of the deploy shares."),
)


_OPERATOR = "an operator's view or setting of the deploy (the CLI and the dashboard have it), not an agent's"

# The ops on no listing, each with its reason (tests/platform/test_op_layout.py: every
# served op is listed or here).
NOT_LISTED: dict[str, str] = {
    "conversation.search": "agents get its results as the conversation section of loom_search",
    "erasure.export": "an NDJSON file of a user's rows for an operator, not an answer for a model",
    "export.start": "an NDJSON file of a namespace's rows for an operator, not an answer for a model",
    "import.start": "an operator's bulk load of a chat app's export (`loom import`), not an agent's act",
    "import.write": "an operator's bulk load of a chat app's export (`loom import`), not an agent's act",
    "import.status": "an operator's bulk load of a chat app's export (`loom import`), not an agent's act",
    "retention.show": _OPERATOR,
    "health.show": _OPERATOR,
    "settings.get": _OPERATOR,
    "settings.set": _OPERATOR,
    "webhook.register": "an integrator's configuration of deliveries, not an agent's memory",
    "webhook.list": "an integrator's configuration of deliveries, not an agent's memory",
    "webhook.delete": "an integrator's configuration of deliveries, not an agent's memory",
    "webhook.rotate_secret": "an integrator's configuration of deliveries, not an agent's memory",
    "webhook.deliveries": "an integrator's configuration of deliveries, not an agent's memory",
}


def listed(toolset: Toolset) -> list[ToolSpec]:
    return [t for t in SPECS if toolset == "all" or t.core]


def find(toolset: Toolset, name: str) -> ToolSpec | None:
    return next((t for t in listed(toolset) if t.name == name), None)
