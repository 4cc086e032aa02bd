"""SQL for loom.tokens."""

from __future__ import annotations

from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.clock import next_version
from loom.store.rows import VERSION, column, frozen_table_row, table


@frozen_table_row
class TokenRow:
    """A row of loom.tokens (its ``version`` is the writer's)."""

    token_id: str = column("String")
    token_hash: str = column("String")
    namespaces: list[str] = column("Array(String)")
    role: str = column("LowCardinality(String)")
    read_scope: str = column("LowCardinality(String)")
    read_user_id: str = column("String")
    read_session_id: str = column("String")
    label: str = column("String")
    created_at: datetime = column("DateTime64(3, 'UTC')", write=False)  # the server's clock, at the insert
    revoked: bool = column("Bool")
    expires_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)


TABLE = table("tokens", TokenRow, extra=[VERSION])
COLUMNS = TABLE.insert_names


def insert(ch: Client, row: TokenRow) -> None:
    TABLE.insert(ch, [row], version=next_version())


def get(ch: Client, token_id: str) -> TokenRow | None:
    return TABLE.first(ch, "WHERE token_id = {id:String}", {"id": token_id})


def list_all(ch: Client, include_revoked: bool = False) -> list[TokenRow]:
    where = "" if include_revoked else "WHERE NOT revoked"
    return TABLE.select(ch, where + " ORDER BY created_at", {})
