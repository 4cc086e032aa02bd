"""Requests and responses of the session-brief ops (session.brief_*)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from loom.limits import MAX_EVENT_CHARS, MAX_EVENTS, MAX_PATH_CHARS
from loom.models.common import AgentId, NamespacedRequest, PageOffset, PageSize, StrictModel, Timestamp

EventKind = Literal[
    "user", "assistant", "edit", "command", "error", "read", "search", "tool", "note", "summary"
]
# Who wrote a revision: the words are the spec's. "model" means the sections came from
# the caller (the calling agent's own model, or a person saving by hand): Loom's server
# ran no model for them, configured or not.
AUTHORS: dict[str, str] = {
    "llm": "Loom's model revised it from the events",
    "deterministic": "Loom's deterministic builder wrote it from the events (no model)",
    "model": "the caller wrote the sections (the calling agent, or a person through the API); "
    "no model ran on the server",
}
# The same, as the dashboard labels a revision.
AUTHOR_LABELS: dict[str, str] = {
    "llm": "revised by Loom's model",
    "deterministic": "built by Loom's rules (no model)",
    "model": "written by the calling agent",
}
Author = Annotated[
    Literal["llm", "deterministic", "model"],
    Field(
        description="Who wrote the revision: " + "; ".join(f'"{k}": {v}' for k, v in AUTHORS.items()) + "."
    ),
]

BriefKey = Annotated[
    str,
    Field(
        max_length=400,
        description=(
            "The brief's key, `^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,159}$`. Empty: `auto/<project>/<branch>`, or "
            "`session/<session_id>` when neither is known. A namespace-wide token may get or delete a bounded "
            "token's brief by its stored key `~<user>~<key>` / `~<user>~<session>~<key>`."
        ),
    ),
]
Ident = Annotated[str, Field(max_length=256)]
Item = Annotated[str, Field(max_length=2_000)]
Items = Annotated[list[Item], Field(max_length=100)]


class BriefEvent(StrictModel):
    kind: EventKind
    text: str = Field("", max_length=MAX_EVENT_CHARS)
    path: str = Field("", max_length=MAX_PATH_CHARS, description="The file an edit/read/error concerns.")
    exit_code: int | None = Field(None, description="A command's exit status.")


class BriefSectionsIn(StrictModel):
    """Sections the agent wrote. Text and state lists given replace the brief's; decisions,
    dead_ends and done are appended. A section left out (or null) stays as it was."""

    goal: str | None = Field(None, max_length=4_000)
    status: str | None = Field(None, max_length=8_000)
    decisions: Items | None = None
    dead_ends: Items | None = None
    done: Items | None = None
    open_questions: Items | None = None
    next_steps: Items | None = None
    key_files: Items | None = None
    constraints: Items | None = None
    pointers: Items | None = None


class BriefSections(StrictModel):
    goal: str
    status: str
    decisions: list[str]
    dead_ends: list[str]
    done: list[str]
    open_questions: list[str]
    next_steps: list[str]
    key_files: list[str]
    constraints: list[str]
    pointers: list[str]


class BriefSaveRequest(NamespacedRequest):
    agent: AgentId = "default"
    brief_key: BriefKey = ""
    project: Ident = ""
    branch: Ident = ""
    session_id: Ident = ""
    user_id: Ident = Field(
        "", description="The user the save is for (a bounded token's own user when empty)."
    )
    events: list[BriefEvent] = Field(
        default_factory=list,
        max_length=MAX_EVENTS,
        description=f"What happened since the last save, at most {MAX_EVENTS}.",
    )
    sections: BriefSectionsIn | None = None
    use_llm: bool = Field(
        True, description="false: do not revise from events (an events-only save is not-revised)."
    )
    event_cursor: Ident = Field(
        "",
        description="The client's position in its event stream; a save repeating the "
        "previous save's session_id and event_cursor is a retry.",
    )
    if_revision: int | None = Field(
        None,
        ge=0,
        description="Compare-and-set: save only if the brief is at this "
        "revision (0: only if it does not exist); 409 otherwise.",
    )


class BriefSaveResponse(StrictModel):
    namespace: str
    brief_key: str
    revision: int
    changed: bool
    reason: str | None = Field(None, description="When nothing was written: retry, not-revised or unchanged.")
    author: Author | None = None
    windows: int = Field(0, description="Windows the events filled (before the cap).")
    windows_revised: int = 0
    windows_failed: int = 0
    events_withheld: int = Field(0, description="Events left out because they read as high sensitivity.")
    events_dropped: int = Field(0, description="Oldest events beyond LOOM_SESSION_BRIEF_MAX_WINDOWS windows.")
    summary_kept: bool = Field(False, description="A summary event was kept as the client's last summary.")


class BriefGetRequest(NamespacedRequest):
    brief_key: BriefKey = ""
    from_session: Ident = ""
    project: Ident = ""
    revision: int | None = Field(None, ge=1)
    full: bool = Field(False, description="Append the client's own last compaction summary verbatim.")


class BriefGetResponse(StrictModel):
    namespace: str
    brief_key: str
    revision: int
    latest_revision: int
    project: str
    branch: str
    author: Author
    session_id: str
    user_id: str
    agent: str
    created_at: Timestamp
    updated_at: Timestamp
    sections: BriefSections
    text: str = Field(
        description="The brief rendered as Markdown (with the summary below it when full=true)."
    )
    summary: str | None = None


class BriefListRequest(NamespacedRequest):
    mine_only: bool = False
    user_id: Ident = Field("", description="With mine_only and a namespace-wide token: whose briefs.")
    project: Ident = ""
    limit: PageSize = 50
    offset: PageOffset = 0


class BriefListItem(StrictModel):
    brief_key: str
    project: str
    branch: str
    revision: int
    author: Author
    updated_at: Timestamp
    line: str = Field(description="One line: key, revision, age and headline.")
    headline: str = Field(
        description="The goal, else the status's first line (empty when that reads as high sensitivity)."
    )


class BriefListResponse(StrictModel):
    namespace: str
    briefs: list[BriefListItem]


class BriefDeleteRequest(NamespacedRequest):
    brief_key: BriefKey = Field(min_length=1)


class BriefDeleteResponse(StrictModel):
    namespace: str
    brief_key: str
    deleted: bool
