"""SQL of loom.settings_overrides: the live settings an admin stored (loom.ops.platform.settings).

A change is a new row per setting; the newest row of a name (by ``version``) is its
state, and a cleared row means "no override: the environment's value applies".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.clock import next_version, utcnow
from loom.store.rows import VERSION, column, frozen_table_row
from loom.store.rows import table as declare_table


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _unjson(raw: str) -> Any:
    return json.loads(raw) if raw else None


@frozen_table_row
class Override:
    """A row of loom.settings_overrides: one setting's stored value (JSON-able)."""

    name: str = column("LowCardinality(String)")
    value: Any = column("String", default=None, encode=_json, decode=_unjson)
    cleared: bool = column("Bool", default=False)
    updated_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    updated_by: str = column("String", default="")


TABLE = declare_table("settings_overrides", Override, extra=[VERSION])


def live(ch: Client) -> dict[str, Override]:
    """Every override in force (the newest row of each name, unless it clears it), by name."""
    rows = TABLE.select(ch, "WHERE NOT cleared", {})
    return {r.name: r for r in rows}


def write(ch: Client, values: Mapping[str, Any], token_id: str) -> None:
    """One insert for a batch of changes: a value per name, None clearing its override.
    One version for the whole batch (they are one change)."""
    now = utcnow()
    rows = [
        Override(name=name, value=value, cleared=value is None, updated_at=now, updated_by=token_id)
        for name, value in values.items()
    ]
    TABLE.insert(ch, rows, version=next_version())


@frozen_table_row
class Change:
    """A row of loom.settings_changes: one setting changed by settings.set."""

    changed_at: datetime = column("DateTime64(3, 'UTC')")
    name: str = column("LowCardinality(String)")
    old_value: Any = column("String", encode=_json, decode=_unjson)
    new_value: Any = column("String", encode=_json, decode=_unjson)
    changed_by: str = column("String")


CHANGES = declare_table("settings_changes", Change)


def record(ch: Client, changes: list[Change]) -> None:
    if changes:
        CHANGES.insert(ch, changes)


def recent_changes(ch: Client, limit: int) -> list[Change]:
    """The newest changes first."""
    return CHANGES.select(
        ch, "ORDER BY changed_at DESC, name LIMIT {lim:UInt32}", {"lim": limit}, final=False
    )
