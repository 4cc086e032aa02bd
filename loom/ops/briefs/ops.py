"""session.brief_save / brief_get / brief_list / brief_delete. See the package docstring
for the rules and the decisions taken where the rules are ambiguous."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from loom import failures, redis_keys, sensitivity
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from loom.leases import LeaseTimeout, hold
from loom.models.session import (
    BriefDeleteRequest,
    BriefGetRequest,
    BriefGetResponse,
    BriefListRequest,
    BriefSaveRequest,
    BriefSaveResponse,
)
from loom.ops.briefs import builder
from loom.ops.briefs.events import Event, check_events, last_summary, plan_windows, withhold_high
from loom.ops.briefs.keys import KeyScope, derive_key
from loom.ops.briefs.llm import MAX_TOKENS, ReplyError, messages_for, parse_reply, pick_llm
from loom.ops.briefs.model import (
    LIST_SECTIONS,
    TEXT_SECTIONS,
    Patch,
    Sections,
    apply,
    headline,
    render,
    same,
    sections_patch,
)
from loom.services import Services
from loom.settings import Settings
from loom.store import briefs as store
from loom.store import namespaces as ns_store

log = loom_logging.get("loom.briefs")

NOT_REVISED = "not-revised"
RETRY = "retry"
UNCHANGED = "unchanged"
SUMMARY_HEADING = "## Last compaction summary (verbatim)"


@dataclass
class ListItem:
    brief_key: str
    project: str
    branch: str
    revision: int
    author: str
    updated_at: datetime
    line: str
    headline: str


@dataclass
class _FromEvents:
    """What a save takes from its events (before the lease)."""

    patch: Patch | None = None  # the model's revision (None: nothing from a model)
    deterministic: list[Event] | None = None  # events for the builder, run under the lease
    summary: str | None = None  # the client's last summary, when taken
    refusal: str | None = None  # NOT_REVISED, or "unavailable" (503 for events alone)
    windows: int = 0
    revised: int = 0
    failed: int = 0
    withheld: int = 0
    dropped: int = 0

    @property
    def author(self) -> Literal["llm", "deterministic"] | None:
        if self.patch is not None:
            return "llm"
        if self.deterministic is not None:
            return "deterministic"
        return None


def lease_key(namespace: str, stored_key: str) -> str:
    return redis_keys.brief_lease(namespace, stored_key)


def _identity(who: Principal, user_id: str, session_id: str) -> tuple[str, str]:
    """The (user, session) a request acts for; a bounded token acts for its own only."""
    if not who.bounded:
        return user_id, session_id
    if user_id and user_id != who.read_user_id:
        raise Forbidden("this token acts for its own user only", field="user_id", rule="read_scope")
    if who.read_scope == "own_session":
        if session_id and session_id != who.read_session_id:
            raise Forbidden("this token acts for its own session only", field="session_id", rule="read_scope")
        return who.read_user_id, who.read_session_id
    return who.read_user_id, session_id


def _is_retry(live: store.BriefRow | None, session: str, cursor: str) -> bool:
    return bool(live and cursor and live.last_session_id == session and live.last_event_cursor == cursor)


def _check_cas(live: store.BriefRow | None, if_revision: int | None) -> None:
    if if_revision is None:
        return
    current = live.revision if live else 0
    if current != if_revision:
        raise Conflict(
            f"the brief is at revision {current}, not {if_revision}",
            field="if_revision",
            rule="compare_and_set",
            current_revision=current,
        )


def _for_model(sections: Sections) -> Sections:
    """The brief as the model may see it: items that read as high left out."""
    out = Sections()
    for name in TEXT_SECTIONS:
        value = getattr(sections, name)
        setattr(out, name, "" if value and sensitivity.reads_as_high(value) else value)
    for name in LIST_SECTIONS:
        setattr(out, name, [v for v in getattr(sections, name) if not sensitivity.reads_as_high(v)])
    return out


async def _switches(svc: Services, namespace: str) -> ns_store.NamespaceConfig | None:
    """The namespace's model-call switch and extraction policy; None when it cannot be read."""
    try:
        return await svc.run(ns_store.get, svc.ch, namespace)
    except Exception as exc:  # an unread switch holds the save; it never fails it with a 500
        log.warning("brief: namespace switches unreadable", namespace=namespace, error=failures.detail(exc))
        return None


async def _from_events(
    svc: Services, settings: Settings, namespace: str, base: Sections, events: Sequence[Event], use_llm: bool
) -> _FromEvents:
    out = _FromEvents()
    if not events:
        return out
    config = await _switches(svc, namespace)
    if config is None:
        out.refusal = "unavailable"
        return out
    if config.extraction_policy:
        out.refusal = NOT_REVISED
        return out
    # The screen is CPU work (about 7 µs an event): off the event loop for a 4,000-event save.
    usable, out.withheld = await svc.run(withhold_high, events, sensitivity.reads_as_high)
    if not use_llm or not config.model_calls_enabled:
        out.refusal = NOT_REVISED
        return out
    if not usable:  # every event read as high: nothing the brief may take from them
        out.refusal = NOT_REVISED
        return out
    summary = last_summary(usable)
    llm, model = pick_llm(svc, settings)
    if llm is None:
        out.deterministic = list(usable)
        out.summary = summary
        return out

    plan = plan_windows(usable, settings.session_brief_window_chars, settings.session_brief_max_windows)
    out.windows, out.dropped = plan.total_windows, plan.events_dropped
    working = base.copy()
    combined = Patch()
    switched_off = policy_on = False
    timeout = settings.llm_timeout_seconds + 5.0
    for i, window in enumerate(plan.windows):
        if i > 0:
            cfg = await _switches(svc, namespace)
            if cfg is None:  # held by an unread switch: this window is not revised
                out.failed += 1
                continue
            if cfg.extraction_policy or not cfg.model_calls_enabled:
                switched_off, policy_on = True, bool(cfg.extraction_policy)
                break
        msgs = messages_for(_for_model(working), window.text(), i + 1, len(plan.windows))
        try:
            reply = await asyncio.wait_for(
                llm.complete(msgs, model=model, max_tokens=MAX_TOKENS, temperature=0.0), timeout
            )
            patch = parse_reply(reply)
        except ReplyError as exc:
            out.failed += 1
            log.warning("brief: window answer unparseable", namespace=namespace, window=i + 1, error=str(exc))
            continue
        except Exception as exc:  # the model call failed: skip the window, revise the rest
            out.failed += 1
            log.warning(
                "brief: window model call failed",
                namespace=namespace,
                window=i + 1,
                error=failures.detail(exc, sent=[m.content for m in msgs]),
            )
            continue
        combined = combined.then(patch)
        working = apply(working, patch)
        out.revised += 1
    if out.revised == 0:
        out.refusal = NOT_REVISED if switched_off else "unavailable"
        return out
    out.patch = combined
    if not policy_on:
        out.summary = summary
    return out


@dataclass(frozen=True)
class _Target:
    """A checked request: the brief it writes and who it writes as."""

    req: BriefSaveRequest
    events: list[Event]
    ns: str
    stored: str  # the key as stored (scoped for a bounded token)
    shown: str  # the key as the caller sees it
    user: str
    session: str
    agent_patch: Patch | None  # the sections the agent wrote (None: none)


@dataclass(frozen=True)
class _Current:
    """The brief as stored now: `row` with a deleted one's tombstone, `live` without."""

    row: store.BriefRow | None
    live: store.BriefRow | None
    retry: bool  # this save was applied already: answer it unchanged

    @property
    def revision(self) -> int:
        return self.live.revision if self.live else 0


async def save(
    svc: Services, who: Principal, req: BriefSaveRequest, *, settings: Settings | None = None
) -> BriefSaveResponse:
    """session.brief_save (writer): revise or start a brief from events, sections, or both.

    The retry and revision checks run on a first read, so that a save answered by them
    pays for no model call, and again under the brief's lease, where they decide."""
    who.require_role(Role.writer)
    target = _target(who, req)
    cur = await _read_checked(svc, target)
    if cur.retry:
        return _as_is(target, cur, RETRY)
    got = await _from_events(
        svc,
        settings or svc.settings,
        target.ns,
        Sections.from_json(cur.live.sections) if cur.live else Sections(),
        target.events,
        req.use_llm,
    )
    result = _as_is(target, cur)
    result.windows, result.windows_revised, result.windows_failed = got.windows, got.revised, got.failed
    result.events_withheld, result.events_dropped = got.withheld, got.dropped
    if got.refusal is not None and target.agent_patch is None:
        return _refused(got, result)
    try:
        async with hold(svc.redis, lease_key(target.ns, target.stored)):
            cur = await _read_checked(svc, target)
            if cur.retry:
                return _as_is(target, cur, RETRY)
            return await _write(svc, who, target, cur, got, result)
    except LeaseTimeout as exc:
        raise Unavailable("another save of this brief holds it; send it again", rule="lease") from exc


def _target(who: Principal, req: BriefSaveRequest) -> _Target:
    """The request checked (namespace, identity, events, sections) and its brief's key."""
    ns = who.namespace(req.namespace)
    scope = KeyScope.of(who)
    user, session = _identity(who, req.user_id, req.session_id)
    events = [Event(e.kind, e.text, e.path, e.exit_code) for e in req.events]
    check_events(events)
    agent_patch = sections_patch(req.sections.model_dump()) if req.sections is not None else None
    if agent_patch is not None and agent_patch.is_empty():
        agent_patch = None  # `sections: {}` (or all null) says nothing
    if not req.events and agent_patch is None:
        raise InvalidRequest("a save needs events or sections", field="events", rule="required")
    stored = scope.for_write(derive_key(req.brief_key, req.project, req.branch, session))
    return _Target(req, events, ns, stored, scope.show(stored), user, session, agent_patch)


async def _read_checked(svc: Services, t: _Target) -> _Current:
    """The brief as stored now, and whether this save was applied already (a retry:
    the same session's same event cursor); Conflict when if_revision is not its
    revision (a retry is answered before that check)."""
    row = await svc.run(store.get, svc.ch, t.ns, t.stored, include_deleted=True)
    live = row if row is not None and not row.deleted else None
    if _is_retry(live, t.session, t.req.event_cursor):
        return _Current(row, live, retry=True)
    _check_cas(live, t.req.if_revision)
    return _Current(row, live, retry=False)


def _as_is(t: _Target, cur: _Current, reason: str | None = None) -> BriefSaveResponse:
    """The answer of a save that writes nothing (yet): the brief as it stands."""
    return BriefSaveResponse(
        namespace=t.ns, brief_key=t.shown, revision=cur.revision, changed=False, reason=reason
    )


def _refused(got: _FromEvents, result: BriefSaveResponse) -> BriefSaveResponse:
    """Events alone that revised nothing: 503 when a model or a switch failed (send
    again), else not-revised."""
    if got.refusal == "unavailable":
        raise Unavailable(
            "no window of this save could be revised (the model failed, answered off "
            "contract, or the namespace's switch could not be read); send it again",
            rule="brief_not_revised",
            windows=got.windows,
            windows_failed=got.failed,
        )
    result.reason = NOT_REVISED
    return result


async def _write(
    svc: Services, who: Principal, t: _Target, cur: _Current, got: _FromEvents, result: BriefSaveResponse
) -> BriefSaveResponse:
    """Under the lease: apply the events' patch, then the agent's, and write the brief
    and its revision (nothing when the brief and its summary come out the same)."""
    req, live = t.req, cur.live
    base = Sections.from_json(live.sections) if live else Sections()
    patch = Patch()
    if got.patch is not None:
        patch = got.patch
    elif got.deterministic is not None:
        patch = builder.build(base, got.deterministic)
    if t.agent_patch is not None:
        patch = patch.then(t.agent_patch)
    new = apply(base, patch)
    old_summary = live.last_summary if live else ""
    summary = got.summary if got.summary is not None else old_summary
    result.summary_kept = got.summary is not None
    result.author = "model" if t.agent_patch is not None else got.author
    result.revision = cur.revision
    if live is not None and same(new, base) and summary == old_summary:
        result.reason, result.author, result.summary_kept = UNCHANGED, None, False
        return result
    revision = (cur.row.revision if cur.row is not None else 0) + 1
    now = utcnow()
    author = result.author or "model"
    brief_row = store.BriefRow(
        namespace=t.ns,
        brief_key=t.stored,
        project=req.project or (live.project if live else ""),
        branch=req.branch or (live.branch if live else ""),
        session_id=live.session_id if live else t.session,
        user_id=t.user,
        agent=req.agent,
        revision=revision,
        sections=new.to_json(),
        author=author,
        last_session_id=t.session,
        last_event_cursor=req.event_cursor,
        last_summary=summary,
        created_at=live.created_at if live else now,
        updated_at=now,
    )
    revision_row = _revision_of(
        brief_row, session_id=t.session, token_id=who.token_id, event_cursor=req.event_cursor, created_at=now
    )
    await svc.run(store.write, svc.ch, brief_row, revision_row)
    result.revision = revision
    result.changed = True
    return result


def _revision_of(row: store.BriefRow, **own: Any) -> store.RevisionRow:
    """The revision row a save writes with its brief row: the brief row's fields by name,
    and `own`, what the brief row does not hold (or holds as of the brief's start)."""
    shared = {
        f.name: getattr(row, f.name) for f in dataclasses.fields(store.RevisionRow) if hasattr(row, f.name)
    }
    return store.RevisionRow(**(shared | own))


# What a revision row shows of its brief, under the names brief_get answers them by.
_REVISION_SHOWS = ("revision", "author", "session_id", "user_id", "agent", "sections")


def _attrs(obj: object, names: Iterable[str]) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in names if hasattr(obj, name)}


async def brief_get(svc: Services, who: Principal, req: BriefGetRequest) -> BriefGetResponse:
    """session.brief_get (viewer): by brief_key, else from_session's newest, else project's newest."""
    who.require_role(Role.viewer)
    ns = who.namespace(req.namespace)
    scope = KeyScope.of(who)
    row = await _find(svc, ns, scope, req)
    shown = scope.show(row.brief_key)
    # The brief row holds the latest revision; an older one is read from its revision row,
    # whose creation is when the brief was updated to it.
    fields = _attrs(row, BriefGetResponse.model_fields)
    fields |= {"session_id": row.last_session_id, "summary": row.last_summary}
    if req.revision is not None and req.revision != row.revision:
        rev = await svc.run(store.get_revision, svc.ch, ns, row.brief_key, req.revision)
        if rev is None:
            raise NotFound(
                f"brief {shown!r} has no revision {req.revision} (latest {row.revision})",
                field="revision",
                latest_revision=row.revision,
            )
        fields |= _attrs(rev, _REVISION_SHOWS) | {"updated_at": rev.created_at, "summary": rev.last_summary}
    sections = Sections.from_json(fields["sections"])
    text = render(sections, key=shown, revision=fields["revision"])
    summary = fields["summary"] if req.full and fields["summary"] else None
    if summary:
        text = f"{text}\n{SUMMARY_HEADING}\n\n{summary}\n"
    shows = {"brief_key": shown, "latest_revision": row.revision, "sections": sections.to_dict()}
    return BriefGetResponse.model_validate(fields | shows | {"text": text, "summary": summary})


async def _find(svc: Services, ns: str, scope: KeyScope, req: BriefGetRequest) -> store.BriefRow:
    """The brief a get names: by key, else a session's newest, else a project's newest."""
    if req.brief_key:
        row = await svc.run(store.get, svc.ch, ns, scope.for_read(req.brief_key))
        if row is None:
            raise NotFound(f"no brief {req.brief_key!r}", field="brief_key")
    elif req.from_session:
        found = await svc.run(store.newest_for_session, svc.ch, ns, req.from_session, scope.prefix)
        row = await svc.run(store.get, svc.ch, ns, found) if found else None
        if row is None:
            raise NotFound(f"no brief written by session {req.from_session!r}", field="from_session")
    elif req.project:
        row = await svc.run(store.newest_for_project, svc.ch, ns, req.project, scope.prefix)
        if row is None:
            raise NotFound(f"no brief for project {req.project!r}", field="project")
    else:
        raise InvalidRequest("give brief_key, from_session or project", field="brief_key", rule="required")
    return row


async def brief_list(svc: Services, who: Principal, req: BriefListRequest) -> list[ListItem]:
    """session.brief_list (viewer): newest first, one line each."""
    who.require_role(Role.viewer)
    ns = who.namespace(req.namespace)
    scope = KeyScope.of(who)
    mine_user = mine_token = ""
    if req.mine_only:
        user, _ = _identity(who, req.user_id, "")
        mine_user = user
        mine_token = "" if user else who.token_id
    rows = await svc.run(
        store.list_briefs,
        svc.ch,
        ns,
        prefix=scope.prefix,
        project=req.project,
        mine_user=mine_user,
        mine_token=mine_token,
        limit=req.limit,
        offset=req.offset,
    )
    items: list[ListItem] = []
    for row in rows:
        shown = scope.show(row.brief_key)
        head = headline(Sections.from_json(row.sections))
        line = f"{shown} · r{row.revision} · {row.updated_at:%Y-%m-%d %H:%M}Z · {row.author}"
        if head:
            line += f" · {head}"
        items.append(
            ListItem(shown, row.project, row.branch, row.revision, row.author, row.updated_at, line, head)
        )
    return items


async def brief_delete(svc: Services, who: Principal, req: BriefDeleteRequest) -> bool:
    """session.brief_delete: forget a brief and every revision of it. An admin deletes any
    brief; a token bound to one user (or session) only its own (its key prefix says so);
    a namespace-wide writer only a brief its own token wrote every revision of."""
    who.require_role(Role.writer)
    ns = who.namespace(req.namespace)
    brief_key = req.brief_key
    if not brief_key:
        raise InvalidRequest("brief_key is required", field="brief_key", rule="required")
    stored = KeyScope.of(who).for_read(brief_key)
    try:
        async with hold(svc.redis, lease_key(ns, stored)):
            row = await svc.run(store.get, svc.ch, ns, stored)
            if row is None:
                return False
            if who.role < Role.admin and not who.bounded:
                await _check_wrote(svc, who, ns, stored)
            await svc.run(store.delete, svc.ch, row)
    except LeaseTimeout as exc:
        raise Unavailable("a save of this brief holds it; send the delete again", rule="lease") from exc
    return True


async def _check_wrote(svc: Services, who: Principal, ns: str, stored: str) -> None:
    writers = await svc.run(store.writers, svc.ch, ns, stored)
    if writers != {who.token_id}:
        raise Forbidden(
            "a writer may delete only a brief its own token wrote; ask an admin",
            field="brief_key",
            rule="written_by",
        )
