"""The one ClickHouse code path: a clickhouse-connect client over HTTP (a server or the embedded endpoint).

Whether the URL points at a real server or at the embedded endpoint makes no
difference below this module.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver import options as driver_options
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.httputil import get_pool_manager

# Loom hands clickhouse-connect lists and reads rows, never DataFrames; yet its plain
# insert (the migration runner's) imports pandas (installed: the embedded engine's wheel
# needs it) to ask whether the data is one. On a new home that cost `loom serve` 0.9 s
# of its start and its supervisor 68 MB of memory for as long as it ran. Told pandas is
# absent, it skips the question; every DataFrame path it then refuses is one Loom never
# takes.
driver_options.pd = None
driver_options.pd_time_test = None

_pool_lock = threading.Lock()
_pool: Any = None


def _shared_pool() -> Any:  # a urllib3 PoolManager (clickhouse-connect's type is untyped)
    # One urllib3 pool per process: every client shares keep-alive connections.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = get_pool_manager(maxsize=64, num_pools=4, block=False)
        return _pool


def connect(
    url: str,
    *,
    database: str = "loom",
    user: str = "default",
    password: str = "",
    create_database: bool = False,
) -> Client:
    """A thread-safe client (no session id: concurrent queries are fine)."""
    parsed = urlparse(url if "://" in url else f"http://{url}")
    host = parsed.hostname or "127.0.0.1"
    secure = parsed.scheme == "https"
    port = parsed.port or (8443 if secure else 8123)
    common = dict(
        host=host,
        port=port,
        username=user,
        password=password,
        secure=secure,
        autogenerate_session_id=False,
        compress="lz4",
        pool_mgr=_shared_pool(),
        connect_timeout=10,
        send_receive_timeout=120,
    )
    if create_database:
        bootstrap = clickhouse_connect.get_client(database="default", **common)
        bootstrap.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}", parameters={"db": database})
        bootstrap.close()
    return clickhouse_connect.get_client(database=database, **common)


def key_sets(keys: Sequence[Sequence[str]], **columns: int) -> dict[str, list[str]]:
    """Query parameters for a lookup of many composite keys: for each named parameter,
    the sorted distinct values at that position of the keys (``key_sets(keys, ns=0,
    th=1)`` -> ``{"ns": [...], "th": [...]}``). The SQL ANDs one ``IN`` per column, which
    ClickHouse can use on the primary key (a tuple IN measured 2-3x slower), so it may
    return a few combinations that were not asked for: callers keep only their keys."""
    return {name: sorted({k[i] for k in keys}) for name, i in columns.items()}


# Skip indexes a small insert leaves to the merges: built at insert they cost the engine
# more than the rest of the insert (a 32-row append flush: 9.6 -> 5.9 ms with its two
# bloom filters deferred; an embedding write: ~0.25 ms of CPU per row for the HNSW
# graph), on the path the appending client waits on, and every merge builds them again
# anyway. A part without them is read in full, which for a fresh small part is nothing.
# A larger insert (bulk load, re-embed) builds its own: merge selection may leave a few
# large parts unmerged for a long time.
INDEX_ON_INSERT_MIN_ROWS = 2_048


DEFER_SETTING = "exclude_materialize_skip_indexes_on_insert"  # ClickHouse 25.10 and later


def insert_settings(
    ch: Client, rows: int, deferred_indexes: Sequence[str], dedup_token: str = ""
) -> dict[str, str] | None:
    """Settings for an INSERT of `rows` rows: `deferred_indexes` left to the merges if
    the insert is small and the server knows how (an older one would refuse the
    setting: it then builds them at insert, as it always did), and the deduplication
    token (a retry cannot double its rows)."""
    settings: dict[str, str] = {}
    if rows < INDEX_ON_INSERT_MIN_ROWS and deferred_indexes and DEFER_SETTING in ch.server_settings:
        settings[DEFER_SETTING] = ",".join(deferred_indexes)
    if dedup_token:
        settings["insert_deduplication_token"] = dedup_token
    return settings or None
