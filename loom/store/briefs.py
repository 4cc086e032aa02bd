"""SQL for loom.session_briefs (one row per brief, revised) and
loom.session_brief_revisions (every revision, kept).

Keys here are stored keys (with a ``~user~`` prefix for bounded tokens); the ops map
them. ``visible_prefix``/``exclude_deeper`` restrict a query to one bounded token's
briefs: keys that start with the prefix and hold no further ``~``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.clock import next_version, utcnow


@dataclass(frozen=True)
class BriefRow:
    namespace: str
    brief_key: str
    project: str
    branch: str
    session_id: str        # the session that started the brief
    user_id: str           # the user of the last save
    agent: str
    revision: int
    sections: str          # JSON
    author: str            # llm | deterministic | model
    last_session_id: str
    last_event_cursor: str
    last_summary: str
    created_at: datetime
    updated_at: datetime
    deleted: bool = False


@dataclass(frozen=True)
class RevisionRow:
    namespace: str
    brief_key: str
    revision: int
    project: str
    branch: str
    session_id: str
    user_id: str
    agent: str
    token_id: str
    sections: str
    author: str
    event_cursor: str
    last_summary: str
    created_at: datetime


_BRIEF_COLS = [f.name for f in fields(BriefRow)]
_REV_COLS = [f.name for f in fields(RevisionRow)]


def _scope_sql(prefix: str) -> str:
    if not prefix:
        return ""
    return (" AND startsWith(brief_key, {prefix:String})"
            " AND position(substring(brief_key, length({prefix:String}) + 1), '~') = 0")


def _brief(row: Sequence[Any]) -> BriefRow:
    data = dict(zip(_BRIEF_COLS, row, strict=True))
    data["revision"] = int(data["revision"])
    data["deleted"] = bool(data["deleted"])
    return BriefRow(**data)


def _revision(row: Sequence[Any]) -> RevisionRow:
    data = dict(zip(_REV_COLS, row, strict=True))
    data["revision"] = int(data["revision"])
    return RevisionRow(**data)


def get(ch: Client, namespace: str, brief_key: str, *, include_deleted: bool = False) -> BriefRow | None:
    """The current row of one brief (a deleted one only when asked: it carries the revision count)."""
    rows = ch.query(
        f"SELECT {', '.join(_BRIEF_COLS)} FROM session_briefs FINAL "
        "WHERE namespace = {ns:String} AND brief_key = {key:String} LIMIT 1",
        parameters={"ns": namespace, "key": brief_key},
    ).result_rows
    if not rows:
        return None
    row = _brief(rows[0])
    if row.deleted and not include_deleted:
        return None
    return row


def get_revision(ch: Client, namespace: str, brief_key: str, revision: int) -> RevisionRow | None:
    rows = ch.query(
        f"SELECT {', '.join(_REV_COLS)} FROM session_brief_revisions FINAL "
        "WHERE namespace = {ns:String} AND brief_key = {key:String} AND revision = {rev:UInt32} LIMIT 1",
        parameters={"ns": namespace, "key": brief_key, "rev": revision},
    ).result_rows
    return _revision(rows[0]) if rows else None


def newest_for_session(ch: Client, namespace: str, session_id: str, prefix: str = "") -> str | None:
    """The stored key of the live brief a session wrote most recently."""
    rows = ch.query(
        "SELECT brief_key FROM session_brief_revisions FINAL "
        "WHERE namespace = {ns:String} AND session_id = {sid:String}" + _scope_sql(prefix) +
        " AND brief_key IN (SELECT brief_key FROM session_briefs FINAL "
        "  WHERE namespace = {ns:String} AND NOT deleted)"
        " ORDER BY version DESC LIMIT 1",
        parameters={"ns": namespace, "sid": session_id, "prefix": prefix},
    ).result_rows
    return str(rows[0][0]) if rows else None


def newest_for_project(ch: Client, namespace: str, project: str, prefix: str = "") -> BriefRow | None:
    rows = ch.query(
        f"SELECT {', '.join(_BRIEF_COLS)} FROM session_briefs FINAL "
        "WHERE namespace = {ns:String} AND project = {project:String} AND NOT deleted" + _scope_sql(prefix) +
        " ORDER BY version DESC LIMIT 1",
        parameters={"ns": namespace, "project": project, "prefix": prefix},
    ).result_rows
    return _brief(rows[0]) if rows else None


def list_briefs(ch: Client, namespace: str, *, prefix: str = "", project: str = "",
                mine_user: str = "", mine_token: str = "", limit: int = 50, offset: int = 0) -> list[BriefRow]:
    """Live briefs, newest first. ``mine_user``/``mine_token``: only briefs with a revision
    written by that user (or, with no user, by that token)."""
    where = "namespace = {ns:String} AND NOT deleted" + _scope_sql(prefix)
    if project:
        where += " AND project = {project:String}"
    if mine_user or mine_token:
        who = "user_id = {mine_user:String}" if mine_user else "token_id = {mine_token:String}"
        where += (" AND brief_key IN (SELECT DISTINCT brief_key FROM session_brief_revisions "
                  "WHERE namespace = {ns:String} AND " + who + ")")
    rows = ch.query(
        f"SELECT {', '.join(_BRIEF_COLS)} FROM session_briefs FINAL WHERE {where} "
        "ORDER BY version DESC LIMIT {limit:UInt32} OFFSET {offset:UInt32}",
        parameters={"ns": namespace, "prefix": prefix, "project": project, "mine_user": mine_user,
                    "mine_token": mine_token, "limit": limit, "offset": offset},
    ).result_rows
    return [_brief(r) for r in rows]


def write(ch: Client, brief: BriefRow, revision: RevisionRow) -> None:
    """A new revision: the revision row first, then the brief's current row.

    Should the second insert fail, the brief still reads as its previous revision and
    the next save writes the same revision number again with a higher version.
    """
    version = next_version()
    ch.insert("session_brief_revisions", [[*(getattr(revision, c) for c in _REV_COLS), version]],
              column_names=[*_REV_COLS, "version"])
    ch.insert("session_briefs", [[*(getattr(brief, c) for c in _BRIEF_COLS), version]],
              column_names=[*_BRIEF_COLS, "version"])


def delete(ch: Client, current: BriefRow) -> None:
    """Forget a brief: a tombstone row (revision count kept, content emptied), then every
    older row of it and all its revisions removed."""
    version = next_version()
    now = utcnow()
    tomb = BriefRow(current.namespace, current.brief_key, current.project, current.branch, "", "",
                    current.agent, current.revision, "{}", current.author, "", "", "",
                    current.created_at, now, True)
    ch.insert("session_briefs", [[*(getattr(tomb, c) for c in _BRIEF_COLS), version]],
              column_names=[*_BRIEF_COLS, "version"])
    params = {"ns": current.namespace, "key": current.brief_key, "v": version}
    ch.command("DELETE FROM session_brief_revisions WHERE namespace = {ns:String} AND brief_key = {key:String}",
               parameters=params)
    ch.command("DELETE FROM session_briefs WHERE namespace = {ns:String} AND brief_key = {key:String} "
               "AND version < {v:UInt64}", parameters=params)
