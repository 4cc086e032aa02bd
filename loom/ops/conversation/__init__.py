"""The conversation plane's ops: append, create, update, threads, get, list, search, reembed,
high_turns,
and the saved-message ops (save, unsave, list, status, search of saved messages).

Each op checks role and namespace first (``who.require_role``, ``who.namespace``).
"""

from loom.ops.conversation.lifecycle.reembedding import ReembedReport, reembed, reembed_namespace
from loom.ops.conversation.reading.searching import SearchResult, search
from loom.ops.conversation.reading.threads import (
    ALL_AGENTS,
    create,
    get,
    high_turns,
    list_turns,
    threads,
    update,
)
from loom.ops.conversation.saved.saved_reads import list_saved_messages, saved_status, search_saved_messages
from loom.ops.conversation.saved.saving import save_message, unsave_message
from loom.ops.conversation.writing.appending import AppendResult, append, close_pipeline, pipeline

__all__ = [
    "ALL_AGENTS",
    "AppendResult",
    "ReembedReport",
    "SearchResult",
    "append",
    "close_pipeline",
    "create",
    "get",
    "high_turns",
    "list_saved_messages",
    "list_turns",
    "pipeline",
    "reembed",
    "reembed_namespace",
    "save_message",
    "saved_status",
    "search",
    "search_saved_messages",
    "threads",
    "unsave_message",
    "update",
]
