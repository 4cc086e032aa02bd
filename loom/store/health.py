"""What health.show reads from ClickHouse: the server's version and uptime, and the
embedding rows written lately by outcome.

The outcome counts are of row *writes* (each version a writer inserted: an embed, a
failed embed, a save's or a deletion's revision), not of distinct turns: ReplacingMergeTree
keeps every version until its merges, and a count with FINAL would cost a merge of the
namespaces' rows per request. conversation_embeddings has no index on `created_at`, so
the statement reads the `created_at` column of the token's namespaces (the sort key's
prefix keeps other namespaces' granules out); `max_execution_time` bounds what it may cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from loom import failures
from loom.store.rows import named

EMBEDDED = "embedded"  # a vector, no error
FAILED = "failed"  # an error recorded, no vector (fail-open)
TOMBSTONED = "tombstoned"  # a deletion's, an erasure's or a re-embed's tombstone revision
NO_VECTOR = "no_vector"  # neither: a live row without a vector or an error (a revision of such)
OTHER_CODE = "other"  # a failure text that starts with no known code (an earlier build's)

_MAX_SECONDS = 2  # what the embedding statement may cost the server (health.show waits as long)
_MAX_GROUPS = 64


@dataclass(frozen=True)
class ServerInfo:
    version: str
    uptime_s: int


@dataclass(frozen=True)
class EmbeddingCount:
    status: str  # EMBEDDED | FAILED | TOMBSTONED | NO_VECTOR
    code: str  # for FAILED: the failure's code (loom.failures); else ''
    rows: int


def server_info(ch: Client) -> ServerInfo:
    """One round trip: it doubles as the liveness probe of the store."""
    row = ch.query("SELECT version() AS server_version, uptime() AS uptime_s").first_item or {}
    return ServerInfo(version=str(row["server_version"]), uptime_s=int(row["uptime_s"]))


def embedding_counts(ch: Client, namespaces: list[str], seconds: int) -> list[EmbeddingCount]:
    """Rows of `namespaces` written in the last `seconds`, by outcome (and failure code)."""
    rows = ch.query(
        "SELECT multiIf(tombstoned, {tombstoned:String}, error != '', {failed:String}, "
        "length(embedding) > 0, {embedded:String}, {no_vector:String}) AS status, "
        "if(status = {failed:String}, trim(splitByChar(':', error)[1]), '') AS code, count() AS n "
        "FROM conversation_embeddings "
        "WHERE namespace IN {namespaces:Array(String)} "
        "AND created_at >= now64(3) - toIntervalSecond({seconds:UInt32}) "
        "GROUP BY status, code ORDER BY status, code LIMIT {groups:UInt32}",
        parameters={
            "namespaces": namespaces,
            "seconds": seconds,
            "tombstoned": TOMBSTONED,
            "failed": FAILED,
            "embedded": EMBEDDED,
            "no_vector": NO_VECTOR,
            "groups": _MAX_GROUPS,
        },
        # length() from the array's sizes only, never its vectors.
        settings={"optimize_functions_to_subcolumns": 1, "max_execution_time": _MAX_SECONDS},
    )
    merged: dict[tuple[str, str], int] = {}
    for r in named(rows):
        # Only a known code is answered: an earlier build's text could carry a driver's words.
        code = (failures.code_of(r["code"]) or OTHER_CODE) if r["status"] == FAILED else ""
        key = (str(r["status"]), code)
        merged[key] = merged.get(key, 0) + int(r["n"])
    return [EmbeddingCount(status, code, n) for (status, code), n in sorted(merged.items())]
