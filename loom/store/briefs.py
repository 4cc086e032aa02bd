"""SQL for loom.session_briefs (one row per brief, revised) and
loom.session_brief_revisions (every revision, kept).

Keys here are stored keys (with a ``~user~`` prefix for bounded tokens); the ops map
them. ``visible_prefix``/``exclude_deeper`` restrict a query to one bounded token's
briefs: keys that start with the prefix and hold no further ``~``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.clock import next_version, utcnow
from loom.store.rows import VERSION, column, frozen_table_row, scalar, table


@frozen_table_row
class BriefRow:
    """A row of loom.session_briefs (its ``version`` is the writer's)."""

    namespace: str = column("LowCardinality(String)")
    brief_key: str = column("String")
    project: str = column("String")
    branch: str = column("String")
    session_id: str = column("String")  # the session that started the brief
    user_id: str = column("String")  # the user of the last save
    agent: str = column("LowCardinality(String)")
    revision: int = column("UInt32")
    sections: str = column("String")  # JSON
    author: str = column("LowCardinality(String)")  # llm | deterministic | model
    last_session_id: str = column("String")
    last_event_cursor: str = column("String")
    last_summary: str = column("String")
    created_at: datetime = column("DateTime64(3, 'UTC')")
    updated_at: datetime = column("DateTime64(3, 'UTC')")
    deleted: bool = column("Bool", default=False)


@frozen_table_row
class RevisionRow:
    """A row of loom.session_brief_revisions (its ``version`` is the writer's)."""

    namespace: str = column("LowCardinality(String)")
    brief_key: str = column("String")
    revision: int = column("UInt32")
    project: str = column("String")
    branch: str = column("String")
    session_id: str = column("String")
    user_id: str = column("String")
    agent: str = column("LowCardinality(String)")
    token_id: str = column("String")
    sections: str = column("String")
    author: str = column("LowCardinality(String)")
    event_cursor: str = column("String")
    last_summary: str = column("String")
    created_at: datetime = column("DateTime64(3, 'UTC')")


BRIEFS = table("session_briefs", BriefRow, extra=[VERSION])
REVISIONS = table("session_brief_revisions", RevisionRow, extra=[VERSION])


def _scope_sql(prefix: str) -> str:
    if not prefix:
        return ""
    return (
        " AND startsWith(brief_key, {prefix:String})"
        " AND position(substring(brief_key, length({prefix:String}) + 1), '~') = 0"
    )


def get(ch: Client, namespace: str, brief_key: str, *, include_deleted: bool = False) -> BriefRow | None:
    """The current row of one brief (a deleted one only when asked: it carries the revision count)."""
    row = BRIEFS.first(
        ch,
        "WHERE namespace = {ns:String} AND brief_key = {key:String} LIMIT 1",
        {"ns": namespace, "key": brief_key},
    )
    if row is None or (row.deleted and not include_deleted):
        return None
    return row


def get_revision(ch: Client, namespace: str, brief_key: str, revision: int) -> RevisionRow | None:
    return REVISIONS.first(
        ch,
        "WHERE namespace = {ns:String} AND brief_key = {key:String} AND revision = {rev:UInt32} LIMIT 1",
        {"ns": namespace, "key": brief_key, "rev": revision},
    )


def newest_for_session(ch: Client, namespace: str, session_id: str, prefix: str = "") -> str | None:
    """The stored key of the live brief a session wrote most recently."""
    found = scalar(
        ch,
        "SELECT brief_key FROM session_brief_revisions FINAL "
        "WHERE namespace = {ns:String} AND session_id = {sid:String}"
        + _scope_sql(prefix)
        + " AND brief_key IN (SELECT brief_key FROM session_briefs FINAL "
        "  WHERE namespace = {ns:String} AND NOT deleted)"
        " ORDER BY version DESC LIMIT 1",
        {"ns": namespace, "sid": session_id, "prefix": prefix},
    )
    return None if found is None else str(found)


def newest_for_project(ch: Client, namespace: str, project: str, prefix: str = "") -> BriefRow | None:
    return BRIEFS.first(
        ch,
        "WHERE namespace = {ns:String} AND project = {project:String} AND NOT deleted"
        + _scope_sql(prefix)
        + " ORDER BY version DESC LIMIT 1",
        {"ns": namespace, "project": project, "prefix": prefix},
    )


def list_briefs(
    ch: Client,
    namespace: str,
    *,
    prefix: str = "",
    project: str = "",
    mine_user: str = "",
    mine_token: str = "",
    limit: int = 50,
    offset: int = 0,
) -> list[BriefRow]:
    """Live briefs, newest first. ``mine_user``/``mine_token``: only briefs with a revision
    written by that user (or, with no user, by that token)."""
    where = "namespace = {ns:String} AND NOT deleted" + _scope_sql(prefix)
    if project:
        where += " AND project = {project:String}"
    if mine_user or mine_token:
        who = "user_id = {mine_user:String}" if mine_user else "token_id = {mine_token:String}"
        where += (
            " AND brief_key IN (SELECT DISTINCT brief_key FROM session_brief_revisions "
            "WHERE namespace = {ns:String} AND " + who + ")"
        )
    return BRIEFS.select(
        ch,
        f"WHERE {where} ORDER BY version DESC LIMIT {{limit:UInt32}} OFFSET {{offset:UInt32}}",
        {
            "ns": namespace,
            "prefix": prefix,
            "project": project,
            "mine_user": mine_user,
            "mine_token": mine_token,
            "limit": limit,
            "offset": offset,
        },
    )


def write(ch: Client, brief: BriefRow, revision: RevisionRow) -> None:
    """A new revision: the revision row first, then the brief's current row.

    Should the second insert fail, the brief still reads as its previous revision and
    the next save writes the same revision number again with a higher version.
    """
    version = next_version()
    REVISIONS.insert(ch, [revision], version=version)
    BRIEFS.insert(ch, [brief], version=version)


def writers(ch: Client, namespace: str, brief_key: str) -> set[str]:
    """The tokens that wrote a revision of the brief."""
    got = scalar(
        ch,
        "SELECT groupUniqArray(token_id) FROM session_brief_revisions "
        "WHERE namespace = {ns:String} AND brief_key = {key:String}",
        {"ns": namespace, "key": brief_key},
    )
    return {str(t) for t in got or ()}


def delete(ch: Client, current: BriefRow) -> None:
    """Forget a brief: a tombstone row (revision count kept, content emptied), then every
    older row of it and all its revisions removed."""
    version = next_version()
    now = utcnow()
    tomb = replace(
        current,
        session_id="",
        user_id="",
        sections="{}",
        last_session_id="",
        last_event_cursor="",
        last_summary="",
        updated_at=now,
        deleted=True,
    )
    BRIEFS.insert(ch, [tomb], version=version)
    params = {"ns": current.namespace, "key": current.brief_key, "v": version}
    ch.command(
        "DELETE FROM session_brief_revisions WHERE namespace = {ns:String} AND brief_key = {key:String}",
        parameters=params,
    )
    ch.command(
        "DELETE FROM session_briefs WHERE namespace = {ns:String} AND brief_key = {key:String} "
        "AND version < {v:UInt64}",
        parameters=params,
    )
