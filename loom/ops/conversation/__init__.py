"""The conversation plane's ops: append, create, update, threads, get, list, reembed.

Each op checks role and namespace first (``who.require_role``, ``who.namespace``).
"""

from loom.ops.conversation.appending import AppendResult, TurnInput, append, close_pipeline, pipeline
from loom.ops.conversation.reembedding import ReembedReport, reembed, reembed_namespace
from loom.ops.conversation.thread_ops import ALL_AGENTS, create, get, list_turns, threads, update

__all__ = [
    "ALL_AGENTS",
    "AppendResult",
    "ReembedReport",
    "TurnInput",
    "append",
    "close_pipeline",
    "create",
    "get",
    "list_turns",
    "pipeline",
    "reembed",
    "reembed_namespace",
    "threads",
    "update",
]
