"""SQL of loom.memory_profiles: one living profile per (namespace, user).

The newest version wins (ReplacingMergeTree(version)). A change to the user's facts
writes a stale mark (a version with no text, `stale` true); a rebuild writes the
profile with the version it stamped before reading the facts, so a change made while
it ran (a later stamp) keeps the profile stale (clickhouse_schema/017).
"""

from __future__ import annotations

from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.clock import next_version, utcnow
from loom.store.rows import column, table, table_row


@table_row
class Profile:
    """A row of loom.memory_profiles: one user's profile (or its stale mark)."""

    namespace: str = column("LowCardinality(String)")
    user_id: str = column("String")
    section_names: list[str] = column("Array(String)", default_factory=list)
    section_texts: list[str] = column("Array(String)", default_factory=list)
    basis: str = column("LowCardinality(String)", default="")  # llm | facts ('' for a stale mark)
    reason: str = column("String", default="")
    fact_ids: list[str] = column("Array(String)", default_factory=list)
    dropped: int = column("UInt32", default=0)
    stale: bool = column("Bool", default=False)
    built_at: datetime = column("DateTime64(3, 'UTC')", default_factory=utcnow)
    version: int = column("UInt64", default=0)

    @property
    def sections(self) -> list[tuple[str, str]]:
        return list(zip(self.section_names, self.section_texts, strict=True))


TABLE = table("memory_profiles", Profile)


def get(ch: Client, namespace: str, user_id: str) -> Profile | None:
    """The newest version of the user's profile (a stale mark included), or None."""
    return TABLE.first(
        ch, "WHERE namespace = {ns:String} AND user_id = {u:String}", {"ns": namespace, "u": user_id}
    )


def put(ch: Client, profile: Profile) -> None:
    TABLE.insert(ch, [profile])


def mark_stale(ch: Client, namespace: str, user_id: str) -> int:
    """Write a stale mark (no text: a forgotten fact leaves nothing in the newest
    version); answers its version."""
    mark = Profile(namespace=namespace, user_id=user_id, stale=True, version=next_version())
    TABLE.insert(ch, [mark])
    return mark.version
