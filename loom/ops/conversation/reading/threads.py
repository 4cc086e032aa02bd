"""Threads and reading turns: conversation.create, update, threads, get and list.

A thread is kept per (namespace, agent, thread_id). Its first append creates it;
conversation.create only attaches a title, metadata or run_id up front, and
conversation.update changes them. Tombstoned turns and threads are left out of every
read. conversation.get and conversation.list serve a turn verbatim even when it reads
as high (sensitivity); conversation.threads does not: it shows such a last turn with an
empty excerpt, deciding on the characters the excerpt shows and 1,024 past them, and a
title that reads as high as empty.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.errors import InvalidRequest, NotFound
from loom.leases import thread_lease
from loom.models.conversation.reading import (
    CreateRequest,
    GetRequest,
    ListRequest,
    ThreadsRequest,
    UpdateRequest,
)
from loom.ops.conversation.common import TITLE_REFUSED, as_utc, decode_cursor, encode_cursor, micros
from loom.sensitivity import high_reasons, reads_as_high, window_reads_as_high
from loom.services import Services
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import threads as thread_store
from loom.store.keys import EmbKey
from loom.store.search import SEARCHED_ROLES

ALL_AGENTS = "*"


@dataclass(kw_only=True)
class ThreadView:
    thread_id: str
    agent: str
    title: str
    metadata: dict[str, Any]
    run_id: str
    created_at: datetime | None
    updated_at: datetime | None
    turns: int = 0
    last_ts: datetime | None = None


@dataclass
class ThreadSummary:
    thread_id: str
    agent: str
    title: str
    excerpt: str
    last_ts: datetime
    last_role: str
    last_msg_id: str
    run_id: str
    created_at: datetime | None


@dataclass(kw_only=True)
class Page:
    messages: list[conv_store.Turn] = field(default_factory=list)
    next_cursor: str | None = None
    # msg_id -> its embedding's state (see embedding_status); only when asked for.
    embedding: dict[str, str] | None = None


# What a turn's embedding is, for a reader that shows it (the dashboard's thread view).
EMBEDDED, PENDING, NOT_INDEXED, REMOVED = "embedded", "pending", "not_indexed", "removed"
FAILED_PREFIX = "failed:"


def embedding_status(m: conv_store.Turn, state: emb_store.EmbeddingState | None) -> str:
    """ "embedded", "failed:<code>" (the stored code, never a driver's text), "pending"
    (no row yet), "removed" (tombstoned), or "not_indexed" (system and tool turns, and a
    turn that reads as high, which never get a vector)."""
    if m.high_sensitivity or not (m.role in SEARCHED_ROLES or m.is_summary):
        return NOT_INDEXED
    if state is None:
        return PENDING
    if state.tombstoned:
        return REMOVED
    if state.has_vector:
        return EMBEDDED
    return FAILED_PREFIX + (state.error or "unknown")


async def _with_embedding(svc: Services, ns: str, thread_id: str, page: Page) -> Page:
    keys = [EmbKey(ns, thread_id, m.msg_id) for m in page.messages]
    states = await svc.run(emb_store.states, svc.ch, keys)
    page.embedding = {
        m.msg_id: embedding_status(m, states.get(EmbKey(ns, thread_id, m.msg_id))) for m in page.messages
    }
    return page


def _client_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """New metadata replaces the titler's mark: a client cannot set it either."""
    return {k: v for k, v in metadata.items() if k != TITLE_REFUSED}


def _view(row: thread_store.ThreadRow, activity: conv_store.ThreadActivity | None = None) -> ThreadView:
    return ThreadView(
        thread_id=row.thread_id,
        agent=row.agent,
        title=row.title,
        metadata=row.metadata,
        run_id=row.run_id,
        created_at=as_utc(row.created_at) if row.created_at else None,
        updated_at=as_utc(row.updated_at) if row.updated_at else None,
        turns=activity.turns if activity else 0,
        last_ts=as_utc(activity.last_ts) if activity and activity.last_ts else None,
    )


async def _write(
    svc: Services, row: thread_store.ThreadRow, now: datetime, ask: CreateRequest | UpdateRequest
) -> None:
    """Attach the fields a client gave (None leaves one as it is) and write a new version."""
    if ask.title is not None:
        row.title = ask.title
    if ask.metadata is not None:
        row.metadata = _client_metadata(ask.metadata)
    if ask.run_id is not None:
        row.run_id = ask.run_id
    row.updated_at = now
    row.version = next_version()
    await svc.run(thread_store.insert, svc.ch, [row])


async def _existing(
    svc: Services, ns: str, agent: str, thread_id: str
) -> tuple[thread_store.ThreadRow | None, conv_store.ThreadActivity]:
    """The thread's live row (None when only its turns say it exists) and its activity;
    404 when there is neither."""
    row, activity = await asyncio.gather(
        svc.run(thread_store.get, svc.ch, ns, agent, thread_id),
        svc.run(conv_store.activity, svc.ch, ns, agent, thread_id),
    )
    live = row if row is not None and not row.tombstoned else None
    if live is None and activity.turns == 0:
        raise NotFound(f"no thread {thread_id!r} for agent {agent!r}", field="thread_id")
    return live, activity


async def create(svc: Services, who: Principal, ask: CreateRequest) -> tuple[ThreadView, bool]:
    """conversation.create (writer): a thread with its title, metadata or run_id up front.
    On a thread that exists, the given fields are attached to it (created: false)."""
    who.require_role(Role.writer)
    ns = who.namespace(ask.namespace)
    agent = ask.agent
    thread_id = ask.thread_id or f"th_{uuid.uuid4().hex}"
    async with thread_lease(svc.redis, ns, thread_id):
        current = await svc.run(thread_store.get, svc.ch, ns, agent, thread_id)
        created = current is None or current.tombstoned
        now = utcnow()
        row = (
            thread_store.ThreadRow(namespace=ns, agent=agent, thread_id=thread_id, created_at=now)
            if created
            else current
        )
        assert row is not None
        row.tombstoned = False
        await _write(svc, row, now, ask)
    return _view(row), created


async def update(svc: Services, who: Principal, ask: UpdateRequest) -> ThreadView:
    """conversation.update (writer): change a thread's title, metadata or run_id. New
    metadata replaces the old, including a title_refused mark."""
    who.require_role(Role.writer)
    ns = who.namespace(ask.namespace)
    agent, thread_id = ask.agent, ask.thread_id
    if ask.title is None and ask.metadata is None and ask.run_id is None:
        raise InvalidRequest(
            "nothing to update: give title, metadata or run_id", field="title", rule="one_of"
        )
    async with thread_lease(svc.redis, ns, thread_id):
        live, activity = await _existing(svc, ns, agent, thread_id)
        now = utcnow()
        row = live or thread_store.ThreadRow(
            namespace=ns, agent=agent, thread_id=thread_id, created_at=activity.first_ts or now
        )
        await _write(svc, row, now, ask)
    return _view(row, activity)


async def threads(svc: Services, who: Principal, ask: ThreadsRequest) -> tuple[list[ThreadSummary], bool]:
    """conversation.threads (viewer): recent threads, newest first; `agent="*"` for all."""
    who.require_role(Role.viewer)
    ns = who.namespace(ask.namespace)
    since = utcnow() - timedelta(days=ask.window_days)
    limit = ask.limit
    recent = await svc.run(
        thread_store.recent,
        svc.ch,
        ns,
        None if ask.agent == ALL_AGENTS else ask.agent,
        since,
        limit=limit + 1,
        offset=ask.offset,
    )
    has_more = len(recent) > limit
    recent = recent[:limit]
    pairs = [(r.agent, r.thread_id) for r in recent]
    shown = svc.settings.conversation_search_excerpt_chars
    last, rows = await asyncio.gather(
        svc.run(conv_store.last_turns, svc.ch, ns, pairs, shown + 1024),
        svc.run(thread_store.get_many, svc.ch, ns, pairs),
    )
    out = []
    for r in recent:
        pair = (r.agent, r.thread_id)
        turn = last.get(pair)
        row = rows.get(pair)
        excerpt = ""
        if turn is not None and not window_reads_as_high(turn.head, shown):
            excerpt = turn.head[:shown]
        title = row.title if row is not None and not row.tombstoned else ""
        if title and reads_as_high(title):
            title = ""
        out.append(
            ThreadSummary(
                r.thread_id,
                r.agent,
                title,
                excerpt,
                as_utc(r.last_ts),
                turn.role if turn else "",
                turn.msg_id if turn else "",
                row.run_id if row is not None else "",
                as_utc(row.created_at) if row is not None and row.created_at else None,
            )
        )
    return out, has_more


async def _page(
    svc: Services, ns: str, ask: GetRequest | ListRequest, *, kind: str, run_id: str | None
) -> Page:
    agent, thread_id, limit = ask.agent, ask.thread_id, ask.limit
    expect = {"k": kind, "th": thread_id, "ag": agent, "o": ask.order, "r": run_id}
    after = None
    if ask.cursor:
        pos = decode_cursor(ask.cursor, expect=expect)
        try:
            after = (int(pos["t"]), str(pos["m"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest(
                "cursor is not one this server issued", field="cursor", rule="opaque"
            ) from None
    messages = await svc.run(
        conv_store.page,
        svc.ch,
        ns,
        agent,
        thread_id,
        limit=limit + 1,
        descending=ask.order == "desc",
        after=after,
        run_id=run_id,
    )
    next_cursor = None
    if len(messages) > limit:
        messages = messages[:limit]
        tail = messages[-1]
        next_cursor = encode_cursor({**expect, "t": micros(tail.ts), "m": tail.msg_id})
    return Page(messages=messages, next_cursor=next_cursor)


async def get(svc: Services, who: Principal, ask: GetRequest) -> tuple[ThreadView, Page | None]:
    """conversation.get (viewer): a thread's metadata; with include_messages, a page of its
    turns (with include_embedding, each with its embedding's state)."""
    who.require_role(Role.viewer)
    ns = who.namespace(ask.namespace)
    row, activity = await _existing(svc, ns, ask.agent, ask.thread_id)
    if row is None:
        row = thread_store.ThreadRow(
            namespace=ns, agent=ask.agent, thread_id=ask.thread_id, created_at=activity.first_ts
        )
    page = None
    if ask.include_messages:
        page = await _page(svc, ns, ask, kind="get", run_id=None)
        if ask.include_embedding:
            page = await _with_embedding(svc, ns, ask.thread_id, page)
    return _view(row, activity), page


async def list_turns(svc: Services, who: Principal, ask: ListRequest) -> Page:
    """conversation.list (viewer): a thread's turns, cursor-paginated, optionally by run_id."""
    who.require_role(Role.viewer)
    return await _page(svc, who.namespace(ask.namespace), ask, kind="list", run_id=ask.run_id)


@dataclass(kw_only=True)
class HighTurnView:
    agent: str
    thread_id: str
    msg_id: str
    role: str
    ts: datetime
    saved_only: bool
    user_id: str
    kinds: list[str]  # the shapes found (api_key, password, ...), never the text


async def high_turns(
    svc: Services, who: Principal, namespace: str, *, limit: int = 50, offset: int = 0
) -> tuple[list[HighTurnView], bool]:
    """conversation.high_turns (admin): the namespace's live turns that read as high,
    newest first, with the kinds of shape found, so an owner can find and clean them.
    The text itself is never part of the answer; conversation.get serves it to a reader
    who opens the thread."""
    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    found = await svc.run(conv_store.high_turns, svc.ch, ns, limit=limit + 1, offset=offset)
    views = [
        HighTurnView(
            agent=t.agent,
            thread_id=t.thread_id,
            msg_id=t.msg_id,
            role=t.role,
            ts=as_utc(t.ts),
            saved_only=t.origin == conv_store.SAVED_ONLY,
            user_id=t.user_id,
            kinds=high_reasons(t.content),
        )
        for t in found[:limit]
    ]
    return views, len(found) > limit
