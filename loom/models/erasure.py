"""Requests and responses of the erasure ops and retention.show."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from loom.models.common import Namespace, RequestBody, Timestamp


class ErasureRequest(RequestBody):
    user_id: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Erase this user's rows (give this or namespace_list).",
    )
    namespaces: list[Namespace] | None = Field(
        None,
        max_length=1000,
        description=(
            "For a user erasure: the namespaces to erase in (default: every namespace the token grants)."
        ),
    )
    namespace_list: list[Namespace] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description=("Erase everything of these namespaces (needs purge: true)."),
    )
    purge: bool = Field(
        False,
        description=(
            "A user erasure also removes the user's embedding rows from disk; required for namespace_list."
        ),
    )


class ErasureResponse(BaseModel):
    erasure_id: str
    kind: str
    state: str
    steps_total: int
    steps_done: int
    receipt: dict[str, Any]
    error: str = ""
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None


class ErasureStatusRequest(RequestBody):
    erasure_id: str = Field(min_length=1, max_length=64)


class ExportRequest(RequestBody):
    user_id: str = Field(min_length=1, max_length=256)
    namespaces: list[Namespace] | None = Field(None, max_length=1000)
    include_tombstoned: bool = True


class RetentionShowRequest(RequestBody):
    pass


class TableStorageOut(BaseModel):
    table: str
    engine: str
    ttl: str
    storage_policy: str
    volumes: list[str]


class TieringOut(BaseModel):
    warm_days: int
    applies: bool
    why: str


class RetentionShowResponse(BaseModel):
    retention_days: int
    tiering: TieringOut
    tables: list[TableStorageOut]
