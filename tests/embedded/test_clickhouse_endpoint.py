"""Contract tests for the embedded ClickHouse endpoint, driven by the real
clickhouse-connect client (what the API and the workers use) against the endpoint
running as its own process."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import clickhouse_connect
import lz4.block
import lz4.frame
import numpy as np
import pytest
import zstandard
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from clickhouse_connect.driver.summary import QuerySummary

from loom.embedded.backends import start_backends
from loom.embedded.clickhouse_endpoint import (
    DEFAULT_CACHE_MB,
    EXIT_ALREADY_RUNNING,
    EXIT_BAD_ARGS,
    LOCK_FILE,
    PORT_FILE,
    EndpointAlreadyRunning,
    EndpointProcess,
    engine_cache_settings,
    engine_server_settings,
    find_running_endpoint,
    read_port_file,
    start_endpoint,
)
from loom.embedded.engine_housekeeping import VectorCacheTrim, release_free_memory
from loom.settings import Settings

ENDPOINT_MODULE = "loom.embedded.clickhouse_endpoint"
HOUSEKEEPING_MODULE = "loom.embedded.engine_housekeeping"
MakeClient = Callable[..., Client]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="module")
def endpoint(data_dir: Path) -> Iterator[EndpointProcess]:
    ep = start_endpoint(data_dir)
    yield ep
    ep.stop()


@pytest.fixture(scope="module")
def make_client(endpoint: EndpointProcess) -> Iterator[MakeClient]:
    clients: list[Client] = []

    def _make(**kwargs: Any) -> Client:
        client = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, **kwargs)
        clients.append(client)
        return client

    yield _make
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def client(make_client: MakeClient) -> Client:
    return make_client()


def _table() -> str:
    return f"t_{secrets.token_hex(4)}"


def _http(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


# 1. start-up handshake, command() ------------------------------------------------------


def test_handshake_and_command(endpoint: EndpointProcess, client: Client, data_dir: Path) -> None:
    assert client.server_version and client.server_version.startswith("26.")
    assert client.ping()
    assert _http(endpoint.port, "GET", "/ping")[2] == b"Ok.\n"
    assert find_running_endpoint(data_dir) == endpoint.url
    assert read_port_file(data_dir) == endpoint.port
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}" and endpoint.alive()

    assert client.command("SELECT timezone()") == "UTC"
    assert client.command("SELECT 42") == 42
    assert client.command("SELECT 1, 'a'") == ["1", "a"]
    assert client.command("SELECT 1 WHERE 0") == ""  # empty result set, not a summary
    table = _table()
    created = client.command(f"CREATE TABLE {table} (a UInt8) ENGINE = MergeTree ORDER BY a")
    assert isinstance(created, QuerySummary)
    inserted = client.command(f"INSERT INTO {table} SELECT number FROM numbers(3)")
    assert isinstance(inserted, QuerySummary) and inserted.written_rows == 3
    assert client.query(f"SELECT a FROM {table} ORDER BY a").result_rows == [(0,), (1,), (2,)]


def test_the_engine_starts_with_its_server_settings(client: Client) -> None:
    """A vector index build takes at most half of the cores (one on two); the cache
    limits are in force."""
    threads = "max_build_vector_similarity_index_thread_pool_size"
    assert engine_server_settings(2)[threads] == 1
    assert engine_server_settings(1)[threads] == 1
    assert engine_server_settings(16)[threads] == 8
    rows = client.query(
        "SELECT name, value FROM system.server_settings WHERE name IN {names:Array(String)}",
        parameters={"names": list(engine_server_settings())},
    ).result_rows
    assert {name: int(value) for name, value in rows} == engine_server_settings()


def test_the_engine_caches_stay_under_the_budget(client: Client) -> None:
    """Every cache the engine reports is bounded by LOOM_CLICKHOUSE_CACHE_MB (2 GiB by
    default; a server's defaults are 5 GiB for several), and together the byte limits
    stay under it. A cache a new engine version adds at a GiB-sized default fails this."""
    budget = DEFAULT_CACHE_MB * 1024 * 1024
    limits = engine_cache_settings()
    assert 0 < sum(limits.values()) <= budget
    assert engine_cache_settings(64)["mark_cache_size"] == 4 * 1024 * 1024
    assert limits["uncompressed_cache_size"] == limits["index_uncompressed_cache_size"] == 0
    rows = client.query(
        "SELECT name, value FROM system.server_settings WHERE name ILIKE '%cache%size%' "
        "AND name NOT ILIKE '%ratio%' AND name NOT ILIKE '%entries%' AND name NOT ILIKE '%elements%'"
    ).result_rows
    in_force = {name: int(value) for name, value in rows}
    assert set(limits) <= set(in_force)
    over = {name: value for name, value in in_force.items() if value > budget}
    assert over == {}, f"caches above the {DEFAULT_CACHE_MB} MiB budget: {over}"
    assert sum(in_force[name] for name in limits) <= budget
    # The query cache: chdb builds none, and no request uses one.
    assert in_force["query_cache.max_size_in_bytes"] == 0
    assert client.command("SELECT value FROM system.settings WHERE name = 'use_query_cache'") == 0


def test_the_cache_budget_setting_reaches_the_engine(tmp_path: Path) -> None:
    """LOOM_CLICKHOUSE_CACHE_MB, through the embedded backends' start, sizes the live
    engine's caches."""
    settings = Settings(home=tmp_path, clickhouse_url="", clickhouse_cache_mb=64)
    backends = start_backends(settings, need_redis=False)
    try:
        with contextlib.closing(clickhouse_connect.get_client(dsn=backends.clickhouse_url)) as ch:
            rows = ch.query(
                "SELECT name, value FROM system.server_settings WHERE name IN {names:Array(String)}",
                parameters={"names": list(engine_cache_settings())},
            ).result_rows
    finally:
        backends.stop()
    assert {name: int(value) for name, value in rows} == engine_cache_settings(64)
    assert dict(rows)["vector_similarity_index_cache_size"] == str(48 * 1024 * 1024)


# 2. Native insert with insert_deduplication_token ---------------------------------------


def test_insert_deduplication_token(make_client: MakeClient) -> None:
    client = make_client(autogenerate_session_id=False)
    session_client = make_client(session_id=f"dedup-{secrets.token_hex(4)}")
    table = _table()
    client.command(
        f"CREATE TABLE {table} (id UInt64, s String) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 1000"
    )
    for c in (client, client, session_client):
        c.insert(
            table,
            [[1, "a"], [2, "b"]],
            column_names=["id", "s"],
            settings={"insert_deduplication_token": "tok-1"},
        )
    assert client.command(f"SELECT count() FROM {table}") == 2
    client.insert(
        table,
        [[1, "a"], [2, "b"]],
        column_names=["id", "s"],
        settings={"insert_deduplication_token": "tok-2"},
    )
    assert client.command(f"SELECT count() FROM {table}") == 4
    # The token is per request: it must not stick to the connection handle and
    # swallow the next (different) insert of the same client.
    for c in (client, session_client):
        c.insert(table, [[3, f"{id(c)}"]], column_names=["id", "s"])
    assert client.command(f"SELECT count() FROM {table}") == 6


def test_other_insert_shapes(client: Client) -> None:
    table = _table()
    client.command(f"CREATE TABLE {table} (id UInt32, s String) ENGINE = MergeTree ORDER BY id")
    client.command(f"INSERT INTO {table} VALUES (1, 'values')")
    client.command(f"INSERT INTO {table} FORMAT CSV", data='2,csv-data\n3,"more"\n')
    client.raw_insert(table, ["id", "s"], insert_block="4\ttsv\n", fmt="TabSeparated")
    client.raw_insert(
        table, ["id", "s"], insert_block=lz4.frame.compress(b"5,lz4\n"), fmt="CSV", compression="lz4"
    )
    assert client.query(f"SELECT id, s FROM {table} ORDER BY id").result_rows == [
        (1, "values"),
        (2, "csv-data"),
        (3, "more"),
        (4, "tsv"),
        (5, "lz4"),
    ]


# 3. server-side parameters and the column types Loom uses -------------------------------

TYPES = {
    "s": ("String", "héllo\t'quoted'\\"),
    "lc": ("LowCardinality(String)", "writer"),
    "u8": ("UInt8", 255),
    "u32": ("UInt32", 4_000_000_000),
    "u64": ("UInt64", 18_000_000_000_000_000_000),
    "i64": ("Int64", -9_000_000_000_000_000_000),
    "f32": ("Float32", 1.25),
    "dt3": ("DateTime64(3, 'UTC')", datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)),
    "dt6": ("DateTime64(6, 'UTC')", datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)),
    "af": ("Array(Float32)", [0.5, -1.5, 3.0]),
    "arr_s": ("Array(String)", ["a", "b,c", "d'e"]),
    "m": ("Map(String, String)", {"k": "v", "x": "y z"}),
    "ns": ("Nullable(String)", "maybe"),
    "ndt": ("Nullable(DateTime64(3))", datetime(2023, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)),
    "b": ("Bool", True),
}


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, datetime):
        return isinstance(actual, datetime) and _utc(actual) == expected
    return bool(expected == actual)


def test_types_round_trip_and_server_side_parameters(client: Client) -> None:
    table = _table()
    columns = ", ".join(f"{name} {ch_type}" for name, (ch_type, _) in TYPES.items())
    client.command(f"CREATE TABLE {table} (id UInt32, {columns}) ENGINE = MergeTree ORDER BY id")
    names = ["id", *TYPES]
    full = [1, *(value for _, value in TYPES.values())]
    nulls = [2, *(None if name in ("ns", "ndt") else value for name, (_, value) in TYPES.items())]
    client.insert(table, [full, nulls], column_names=names)

    rows = client.query(f"SELECT {', '.join(names)} FROM {table} ORDER BY id").result_rows
    assert len(rows) == 2
    for expected, actual in zip(full, rows[0], strict=True):
        assert _same(expected, actual), (expected, actual)
    assert rows[1][names.index("ns")] is None and rows[1][names.index("ndt")] is None

    # A dict binds as JSON unless the client is told Map (same with a real server).
    clickhouse_connect.common.set_setting("dict_parameter_format", "map")
    try:
        for name, (ch_type, value) in TYPES.items():
            got = client.query(f"SELECT {{p:{ch_type}}} AS p", parameters={"p": value}).result_rows[0][0]
            assert _same(value, got), (name, value, got)
            hits = client.query(
                f"SELECT count() FROM {table} WHERE {name} = {{p:{ch_type}}}", parameters={"p": value}
            ).result_rows[0][0]
            assert hits == (1 if name in ("ns", "ndt") else 2), name
    finally:
        clickhouse_connect.common.set_setting("dict_parameter_format", "json")

    assert (
        client.command("CREATE DATABASE IF NOT EXISTS {db:Identifier}", parameters={"db": "loom_p"})
        is not None
    )
    assert "loom_p" in str(client.command("SHOW DATABASES"))


def test_large_parameter_goes_as_a_form(client: Client) -> None:
    # Over 4 KB of bound parameters, clickhouse-connect posts multipart/form-data.
    vector = [i / 7 for i in range(384)]
    result = client.query(
        "SELECT length({v:Array(Float32)}) AS n, arraySum({v:Array(Float32)}) AS total",
        parameters={"v": vector},
    ).result_rows
    assert result[0][0] == 384
    assert result[0][1] == pytest.approx(sum(vector), rel=1e-5)


def test_database_parameter(make_client: MakeClient) -> None:
    base = make_client()
    base.command("CREATE DATABASE IF NOT EXISTS loom_db_param")
    scoped = make_client(database="loom_db_param", autogenerate_session_id=False)
    assert scoped.command("SELECT currentDatabase()") == "loom_db_param"
    assert base.command("SELECT currentDatabase()") == "default"


# 4. large compressed inserts; zstd and gzip; response compression -----------------------


def _vectors(n: int) -> np.ndarray:
    ids = np.arange(n, dtype=np.int64)
    return ((ids[:, None] * 7 + np.arange(384)[None, :]) % 101).astype(np.float32)


@pytest.mark.parametrize(("compress", "rows"), [("lz4", 50_000), ("zstd", 20_000), ("gzip", 4_000)])
def test_large_compressed_insert(make_client: MakeClient, compress: str, rows: int) -> None:
    client = make_client(compress=compress)
    table = _table()
    client.command(
        f"CREATE TABLE {table} (id UInt32, label String, v Array(Float32)) ENGINE = MergeTree ORDER BY id"
    )
    vectors = _vectors(rows)
    # clickhouse-connect sizes blocks from a per-row estimate that counts an array as
    # one element; the label makes it cut several blocks, i.e. several lz4/zstd frames.
    label = "x" * 200
    summary = client.insert(
        table, [[i, label, vectors[i]] for i in range(rows)], column_names=["id", "label", "v"]
    )
    assert summary.written_rows == rows
    count, total, distinct = client.query(
        f"SELECT count(), sum(arraySum(v)), uniqExact(id) FROM {table}"
    ).result_rows[0]
    assert (count, distinct) == (rows, rows)  # every frame was read
    assert total == float(vectors.astype(np.float64).sum())
    # and back through a compressed response
    back = client.query(f"SELECT v FROM {table} WHERE id IN (0, 1234) ORDER BY id").result_rows
    assert [list(r[0]) for r in back] == [list(vectors[0]), list(vectors[1234])]


@pytest.mark.parametrize("encoding", ["lz4", "zstd", "gzip", "deflate"])
def test_response_compression(endpoint: EndpointProcess, encoding: str) -> None:
    status, headers, body = _http(
        endpoint.port,
        "POST",
        "/?enable_http_compression=1",
        b"SELECT number FROM numbers(1000) FORMAT TabSeparated",
        {"Accept-Encoding": encoding},
    )
    assert status == 200 and headers["content-encoding"] == encoding
    plain = {
        "lz4": lz4.frame.decompress,
        "zstd": zstandard.ZstdDecompressor().decompress,
        "gzip": gzip.decompress,
        "deflate": zlib.decompress,
    }[encoding](body)
    assert plain == "".join(f"{i}\n" for i in range(1000)).encode()
    assert headers["x-clickhouse-format"] == "TabSeparated"


def test_request_with_several_lz4_frames_and_native_blocks(endpoint: EndpointProcess, client: Client) -> None:
    table = _table()
    client.command(f"CREATE TABLE {table} (id UInt32) ENGINE = MergeTree ORDER BY id")
    parts = [b"".join(f"{i}\n".encode() for i in range(k * 1000, (k + 1) * 1000)) for k in range(3)]
    body = b"".join(lz4.frame.compress(p) for p in parts)  # three frames, one body
    query = f"/?query=INSERT+INTO+{table}+FORMAT+CSV"
    status, _, text = _http(endpoint.port, "POST", query, body, {"Content-Encoding": "lz4"})
    assert status == 200, text
    # decompress=1: ClickHouse's own block compression (checksum, method, sizes, LZ4 block)
    more = b"".join(f"{i}\n".encode() for i in range(3000, 3500))
    packed = lz4.block.compress(more, store_size=False)
    block = bytes(16) + b"\x82" + (len(packed) + 9).to_bytes(4, "little") + len(more).to_bytes(4, "little")
    status, _, text = _http(endpoint.port, "POST", query + "&decompress=1", block + packed)
    assert status == 200, text
    assert client.command(f"SELECT count(), uniqExact(id) FROM {table}") == ["3500", "3500"]


# 5. errors ------------------------------------------------------------------------------


def test_errors_surface_as_database_errors(endpoint: EndpointProcess, client: Client) -> None:
    with pytest.raises(DatabaseError) as unknown:
        client.query("SELECT * FROM no_such_table")
    assert "Code: 60" in str(unknown.value) and unknown.value.code == 60
    with pytest.raises(DatabaseError) as syntax:
        client.command("SELEC 1")
    assert "Code: 62" in str(syntax.value)
    with pytest.raises(DatabaseError) as insert:
        client.insert("no_such_table", [[1]], column_names=["a"], column_type_names=["UInt8"])
    assert "Code: 60" in str(insert.value)

    status, headers, body = _http(endpoint.port, "POST", "/", b"SELECT * FROM no_such_table")
    assert status == 404 and headers["x-clickhouse-exception-code"] == "60"
    assert body.startswith(b"Code: 60. DB::Exception:")
    status, headers, _ = _http(endpoint.port, "POST", "/", b"SELEC 1")
    assert status == 400 and headers["x-clickhouse-exception-code"] == "62"
    # the connection and the client stay usable after errors
    assert client.command("SELECT 1") == 1


# 6. sessions ----------------------------------------------------------------------------


def test_sessions_keep_settings_and_temporary_tables(make_client: MakeClient) -> None:
    a = make_client(session_id=f"a-{secrets.token_hex(4)}")
    b = make_client(session_id=f"b-{secrets.token_hex(4)}")
    sessionless = make_client(autogenerate_session_id=False)
    default_block = sessionless.command("SELECT getSetting('max_block_size')")

    a.command("SET max_block_size = 1234")
    assert a.command("SELECT getSetting('max_block_size')") == 1234
    assert b.command("SELECT getSetting('max_block_size')") == default_block
    # a per-request setting applies to that request only, then the session's SET is back
    assert a.command("SELECT getSetting('max_block_size')", settings={"max_block_size": 777}) == 777
    assert a.command("SELECT getSetting('max_block_size')") == 1234
    assert sessionless.command("SELECT getSetting('max_block_size')", settings={"max_block_size": 99}) == 99
    assert sessionless.command("SELECT getSetting('max_block_size')") == default_block

    a.command("CREATE TEMPORARY TABLE tmp_rows (x UInt8)")
    a.command("INSERT INTO tmp_rows VALUES (1), (2)")
    a.insert("tmp_rows", [[3]], column_names=["x"])
    assert a.command("SELECT count() FROM tmp_rows") == 3
    for other in (b, sessionless):
        with pytest.raises(DatabaseError) as missing:
            other.command("SELECT count() FROM tmp_rows")
        assert "Code: 60" in str(missing.value)

    # USE in a session sticks to that session only
    sessionless.command("CREATE DATABASE IF NOT EXISTS loom_use")
    a.command("USE loom_use")
    assert a.command("SELECT currentDatabase()") == "loom_use"
    assert b.command("SELECT currentDatabase()") == "default"
    assert sessionless.command("SELECT currentDatabase()") == "default"


def test_session_check_and_lock(endpoint: EndpointProcess) -> None:
    status, headers, _ = _http(endpoint.port, "POST", "/?session_id=nope-123&session_check=1", b"SELECT 1")
    assert status == 404 and headers["x-clickhouse-exception-code"] == "372"

    # One query at a time per session, as on the server (another process sharing it gets 373).
    sid = f"busy-{secrets.token_hex(4)}"
    slow = threading.Thread(
        target=_http, args=(endpoint.port, "POST", f"/?session_id={sid}", b"SELECT sleep(1)")
    )
    slow.start()
    time.sleep(0.3)
    status, headers, _ = _http(endpoint.port, "POST", f"/?session_id={sid}", b"SELECT 1")
    slow.join()
    assert headers["x-clickhouse-exception-code"] == "373" and status not in (429, 503, 504)
    assert _http(endpoint.port, "POST", f"/?session_id={sid}&session_check=1", b"SELECT 1")[2] == b"1\n"


# 7. two OS processes inserting at once --------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, clickhouse_connect
    port, table, tag = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, compress="lz4")
    for batch in range(25):
        client.insert(table, [[tag, batch, i] for i in range(400)], column_names=["p", "b", "i"])
""")


def test_two_processes_insert_at_once(endpoint: EndpointProcess, client: Client) -> None:
    table = _table()
    client.command(
        f"CREATE TABLE {table} (p UInt8, b UInt32, i UInt32) ENGINE = MergeTree ORDER BY (p, b, i)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(endpoint.port), table, str(tag)])
        for tag in (1, 2)
    ]
    assert [p.wait(60) for p in procs] == [0, 0]
    assert client.query(f"SELECT p, count() FROM {table} GROUP BY p ORDER BY p").result_rows == [
        (1, 10_000),
        (2, 10_000),
    ]


# 8. FINAL, lightweight DELETE, OPTIMIZE FINAL -------------------------------------------


def test_final_delete_optimize(client: Client) -> None:
    table = _table()
    client.command(
        f"CREATE TABLE {table} (k UInt32, v String, version UInt64) "
        "ENGINE = ReplacingMergeTree(version) ORDER BY k"
    )
    client.insert(table, [[1, "a", 1], [2, "b", 1], [3, "c", 1]], column_names=["k", "v", "version"])
    client.insert(table, [[1, "a2", 2]], column_names=["k", "v", "version"])
    assert client.query(f"SELECT k, v FROM {table} FINAL ORDER BY k").result_rows == [
        (1, "a2"),
        (2, "b"),
        (3, "c"),
    ]
    client.command(f"DELETE FROM {table} WHERE k = 2")
    assert client.query(f"SELECT k FROM {table} FINAL ORDER BY k").result_rows == [(1,), (3,)]
    client.command(f"OPTIMIZE TABLE {table} FINAL")
    assert client.query(f"SELECT k, v FROM {table} ORDER BY k").result_rows == [(1, "a2"), (3, "c")]


# 9. one endpoint per data directory -----------------------------------------------------


def test_second_endpoint_on_same_dir_exits_at_once(endpoint: EndpointProcess, data_dir: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", ENDPOINT_MODULE, "--data-dir", str(data_dir), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert time.monotonic() - started < 10
    assert proc.returncode == EXIT_ALREADY_RUNNING
    assert f"another Loom ClickHouse endpoint already owns {data_dir}" in proc.stderr
    assert f"(pid {endpoint.pid})" in proc.stderr
    with pytest.raises(EndpointAlreadyRunning, match="already owns"):
        start_endpoint(data_dir)
    assert endpoint.alive() and read_port_file(data_dir) == endpoint.port


# 10. SIGTERM and SIGKILL ----------------------------------------------------------------


def test_sigterm_exits_cleanly_and_keeps_data(tmp_path: Path) -> None:
    ep = start_endpoint(tmp_path)
    try:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=ep.port)
        c.command("CREATE TABLE kept (a UInt8) ENGINE = MergeTree ORDER BY a")
        c.insert("kept", [[7]], column_names=["a"])
        c.close()
        assert (tmp_path / PORT_FILE).exists()
        ep.stop()
        assert ep.returncode == 0
        assert not (tmp_path / PORT_FILE).exists()
        assert (tmp_path / LOCK_FILE).exists()
        assert find_running_endpoint(tmp_path) is None
    finally:
        ep.stop()
    again = start_endpoint(tmp_path)  # the lock was released
    try:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=again.port)
        assert c.command("SELECT sum(a) FROM kept") == 7
        c.close()
    finally:
        again.stop()


def test_sigterm_finishes_the_insert_in_flight(tmp_path: Path) -> None:
    ep = start_endpoint(tmp_path)
    first_sent, resume = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def body() -> Generator[bytes, None, None]:  # a streamed (chunked) insert we hold open
        yield b"".join(f"{i}\n".encode() for i in range(50_000))
        first_sent.set()
        resume.wait(20)
        yield b"".join(f"{i}\n".encode() for i in range(50_000, 100_000))

    try:
        client = clickhouse_connect.get_client(host="127.0.0.1", port=ep.port)
        client.command("CREATE TABLE inflight (id UInt32) ENGINE = MergeTree ORDER BY id")

        def insert() -> None:
            try:
                outcome.append(client.raw_insert("inflight", ["id"], insert_block=body(), fmt="CSV"))
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=insert)
        thread.start()
        assert first_sent.wait(20)
        time.sleep(0.2)
        ep.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert ep.alive()  # draining: waits for the insert in flight
        assert not (tmp_path / PORT_FILE).exists()  # but no longer advertised
        resume.set()
        thread.join(30)
        assert ep.process.wait(30) == 0
    finally:
        resume.set()
        ep.stop()
    assert isinstance(outcome[0], QuerySummary) and outcome[0].written_rows == 100_000
    again = start_endpoint(tmp_path)
    try:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=again.port)
        assert c.command("SELECT count(), uniqExact(id) FROM inflight") == ["100000", "100000"]
        c.close()
    finally:
        again.stop()


def test_sigkill_mid_insert_stream_loses_no_acknowledged_row(tmp_path: Path) -> None:
    ep = start_endpoint(tmp_path)
    client = clickhouse_connect.get_client(host="127.0.0.1", port=ep.port, compress="lz4")
    client.command("CREATE TABLE acked (batch UInt32, i UInt32) ENGINE = MergeTree ORDER BY (batch, i)")
    acknowledged: list[int] = []
    failures: list[BaseException] = []

    def writer() -> None:
        for batch in range(100_000):
            try:
                client.insert("acked", [[batch, i] for i in range(200)], column_names=["batch", "i"])
            except Exception as exc:  # the endpoint died under us
                failures.append(exc)
                return
            acknowledged.append(batch)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(acknowledged) < 40 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        os.kill(ep.pid, signal.SIGKILL)
        ep.process.wait(10)
        thread.join(30)
    finally:
        ep.stop()
    assert failures and len(acknowledged) >= 40
    assert find_running_endpoint(tmp_path) is None  # stale port file, nobody answers

    again = start_endpoint(tmp_path)
    try:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=again.port)
        present: dict[int, int] = {
            int(b): int(n) for b, n in c.query("SELECT batch, count() FROM acked GROUP BY batch").result_rows
        }
        c.close()
    finally:
        again.stop()
    missing = [b for b in acknowledged if present.get(b) != 200]
    assert not missing, f"acknowledged batches lost or partial: {missing[:10]}"


# 11. loopback only ----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_non_loopback_host_is_refused(tmp_path: Path, host: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", ENDPOINT_MODULE, "--data-dir", str(tmp_path), "--port", "0", "--host", host],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == EXIT_BAD_ARGS
    assert "loopback only" in proc.stderr
    assert not (tmp_path / PORT_FILE).exists()


def test_the_vector_index_cache_is_dropped_once_removed_indexes_outweigh_live_ones(client: Client) -> None:
    """Indexes of parts a merge removed stay in the engine's cache until it is full; the
    endpoint's check follows the indexed parts, and drops the cache once the indexes of
    the parts removed since the last drop outweigh the live ones and the slack, and not
    before."""
    table = _table()
    client.command(
        f"CREATE TABLE {table} (id UInt64, embedding Array(BFloat16) CODEC(NONE), "
        "INDEX ann embedding TYPE vector_similarity('hnsw', 'cosineDistance', 8, 'bf16', 16, 0) GRANULARITY 100000000) "
        "ENGINE = ReplacingMergeTree ORDER BY id SETTINGS index_granularity = 64"
    )
    q = "[" + ",".join(["0.5"] * 8) + "]"

    def search() -> None:
        client.query(
            f"SELECT id FROM {table} ORDER BY cosineDistance(embedding, {q}::Array(BFloat16)) LIMIT 3"
        )

    def query(sql: str) -> str:
        return client.raw_query(sql).decode()

    def cached() -> int:
        return int(query("SELECT value FROM system.metrics WHERE metric = 'VectorSimilarityIndexCacheBytes'"))

    def six_parts_merged(first: int) -> None:
        for batch in range(first, first + 6):  # six parts, each searched: six indexes cached
            client.command(
                f"INSERT INTO {table} SELECT number + {batch} * 500, "
                f"arrayMap(i -> toBFloat16(randNormal(0, 1, i + number)), range(8)) FROM numbers(500)"
            )
            search()
        client.command(f"OPTIMIZE TABLE {table} FINAL")
        search()

    trim = VectorCacheTrim()
    slack = f"{HOUSEKEEPING_MODULE}.VECTOR_CACHE_SLACK_BYTES"
    assert not trim.check(query)  # nothing removed yet
    with mock.patch(slack, 1 << 30):
        six_parts_merged(0)
        assert cached() > 0
        assert not trim.check(query)  # six indexes removed: within the slack
        assert trim.removed > 0
    with mock.patch(slack, 0):
        six_parts_merged(6)
        # removed: twelve 500-vector indexes and a 3,000-vector one; live: one of 6,000
        assert trim.check(query)
        assert cached() == 0 and trim.removed == 0
        search()  # the live part's index is cached again; nothing was removed since
        assert not trim.check(query)
    client.command(f"DROP TABLE {table} SYNC")


def _held_free_mb(query: Callable[[str], str]) -> float:
    """Pages the allocator holds resident beyond those in use (jemalloc's resident minus
    active, metadata aside), in MB."""
    stats = query("SELECT stats FROM system.jemalloc_stats FORMAT TSVRaw")
    m = re.search(r"active: (\d+), metadata: (\d+).*?resident: (\d+)", stats)
    assert m, "the engine reports jemalloc's totals"
    active, metadata, resident = map(int, m.groups())
    return (resident - active - metadata) / 1e6


def test_memory_release_hands_freed_pages_back(client: Client) -> None:
    """After a query that allocated and freed a few hundred MB the allocator keeps the
    pages (no background purge); the endpoint's housekeeping gives them back."""

    def query(sql: str) -> str:
        return str(client.command(sql))

    query("SELECT uniqExact(toString(number)) FROM numbers(3000000)")  # a hash set of ~150 MB
    before = _held_free_mb(query)
    release_free_memory(query)
    after = _held_free_mb(query)
    assert before > 20, before
    assert after < before / 2, (before, after)
