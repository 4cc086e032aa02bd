"""SQL for loom.tokens."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.clock import next_version

COLUMNS = ["token_id", "token_hash", "namespaces", "role", "read_scope", "read_user_id",
           "read_session_id", "label", "revoked", "version"]


@dataclass(frozen=True)
class TokenRow:
    token_id: str
    token_hash: str
    namespaces: list[str]
    role: str
    read_scope: str
    read_user_id: str
    read_session_id: str
    label: str
    created_at: datetime
    revoked: bool


_SELECT = ("SELECT token_id, token_hash, namespaces, role, read_scope, read_user_id, read_session_id, "
           "label, created_at, revoked FROM tokens FINAL")


def insert(ch: Client, row: TokenRow) -> None:
    ch.insert("tokens", [[row.token_id, row.token_hash, row.namespaces, row.role, row.read_scope,
                          row.read_user_id, row.read_session_id, row.label, row.revoked, next_version()]],
              column_names=COLUMNS)


def get(ch: Client, token_id: str) -> TokenRow | None:
    rows = ch.query(_SELECT + " WHERE token_id = {id:String}", parameters={"id": token_id}).result_rows
    return TokenRow(*rows[0]) if rows else None


def list_all(ch: Client, include_revoked: bool = False) -> list[TokenRow]:
    where = "" if include_revoked else " WHERE NOT revoked"
    return [TokenRow(*r) for r in ch.query(_SELECT + where + " ORDER BY created_at").result_rows]
