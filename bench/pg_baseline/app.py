"""The baseline's HTTP layer: the same four operations as Loom's, over Postgres + pgvector.

Run by the harness as ``uvicorn bench.pg_baseline.app:create_app --factory`` (the same server
and flags ``loom serve`` uses for Loom's API), configured from the environment:

* ``BENCH_PG_DSN``: libpq connection string (the unix socket of the harness's server)
* ``BENCH_PG_POOL``: connection pool size (default 8)
* ``BENCH_TOKEN``: the bearer token every request must carry
* ``BENCH_EF_SEARCH``: initial ``hnsw.ef_search`` (the harness tunes it via ``/bench/settings``)
* ``BENCH_EMBED_BATCH``: MiniLM batch size inside one model call (default 16)

Routes (POST, JSON):

* ``/v1/conversation.append`` ``{namespace, thread_id, msg_id, role, content, user_id?, ts?, embed}``
  -> ``{stored, reason?, embedded}``. Idempotent on ``(namespace, thread_id, msg_id)``; user and
  assistant turns are embedded (first 2,048 characters) when ``embed`` is true, in the request.
* ``/v1/conversation.search`` ``{namespace, query | vector, k}`` -> ``{hits: [{thread_id, msg_id, score}]}``
  (cosine floor 0.30, HNSW with ``hnsw.ef_search``).
* ``/v1/conversation.search_saved_messages`` ``{namespace, user_id, query, k}`` -> ``{hits}``
  (pgvector leg + ``ts_rank`` leg, reciprocal-rank fusion, k=60).
* ``/v1/erasure.user`` ``{namespace, user_id}`` -> ``{deleted}``.

Query and turn texts are embedded with Loom's MiniLM embedder (the same model and settings),
through a batcher: requests that arrive while the model is busy share its next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Literal

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from bench.pg_baseline import sql

EMBED_CHARS = 2048
MIN_SIMILARITY = 0.30
EMBEDDED_ROLES = ("user", "assistant")


class Batcher:
    """Embeds texts for concurrent requests: whatever is queued when the model frees up goes in
    one call (no added wait at low load, batches under load)."""

    def __init__(self, embedder: Any, max_batch: int = 64) -> None:
        self.embedder = embedder
        self.max_batch = max_batch
        self.queue: asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="embed")
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.executor.shutdown(wait=False)

    async def embed(self, text: str) -> np.ndarray:
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self.queue.put((text, fut))
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                vecs = await loop.run_in_executor(self.executor, self.embedder.embed, [t for t, _ in batch])
            except Exception as exc:  # fail the requests, keep serving
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), v in zip(batch, vecs, strict=True):
                if not f.done():
                    f.set_result(v)


class AppendRequest(BaseModel):
    namespace: str
    thread_id: str
    msg_id: str
    role: Literal["user", "assistant", "system", "tool"]
    content: str
    user_id: str | None = None
    ts: str | None = None
    embed: bool = True


class SearchRequest(BaseModel):
    namespace: str
    query: str | None = None
    vector: list[float] | None = None
    k: int = Field(10, ge=1, le=100)


class SavedSearchRequest(BaseModel):
    namespace: str
    user_id: str
    query: str
    k: int = Field(10, ge=1, le=100)


class EraseRequest(BaseModel):
    namespace: str
    user_id: str


class Settings(BaseModel):
    ef_search: int | None = Field(None, ge=1, le=1000)
    iterative_scan: Literal["off", "relaxed_order", "strict_order"] | None = None


class State:
    pool: AsyncConnectionPool
    batcher: Batcher
    token: str
    ef_search: int = 40
    iterative_scan: str | None = None
    applied: dict[int, tuple[int, str | None]]


def create_app() -> FastAPI:
    state = State()
    state.token = os.environ.get("BENCH_TOKEN", "")
    state.ef_search = int(os.environ.get("BENCH_EF_SEARCH", "40"))
    state.iterative_scan = os.environ.get("BENCH_ITERATIVE_SCAN") or None
    state.applied = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from loom.providers.embedders import build_embedder

        # Batches of 16 inside each model call: a batch is padded to its longest text, and turns
        # of mixed lengths arrive together, so smaller sorted batches waste less (measured on
        # the append texts: ~34 texts/s at 16 vs ~19 at the default 32, 32 texts per call).
        embedder = build_embedder("minilm", batch_size=int(os.environ.get("BENCH_EMBED_BATCH", "16")))
        embedder.embed(["warm up"])  # type: ignore[attr-defined]
        state.batcher = Batcher(embedder)
        state.batcher.start()
        size = int(os.environ.get("BENCH_PG_POOL", "8"))
        state.pool = AsyncConnectionPool(
            os.environ["BENCH_PG_DSN"],
            min_size=size,
            max_size=size,
            configure=sql.register_vector_async,
            open=False,
            kwargs={"autocommit": True},
        )
        await state.pool.open(wait=True)
        try:
            yield
        finally:
            await state.pool.close()
            await state.batcher.stop()

    app = FastAPI(title="pgvector baseline", lifespan=lifespan)

    def auth(authorization: str = Header("")) -> None:
        if state.token and not hmac.compare_digest(authorization, f"Bearer {state.token}"):
            raise HTTPException(401, "bad token")

    async def tune(conn: Any) -> None:
        """Apply the current hnsw settings to this connection once (cached by backend pid)."""
        want = (state.ef_search, state.iterative_scan)
        pid = conn.info.backend_pid
        if state.applied.get(pid) != want:
            await conn.execute(f"SET hnsw.ef_search = {int(state.ef_search)}")
            if state.iterative_scan:
                await conn.execute(f"SET hnsw.iterative_scan = {state.iterative_scan}")
            state.applied[pid] = want

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/bench/settings", dependencies=[Depends(auth)])
    async def settings(body: Settings) -> dict[str, Any]:
        if body.ef_search is not None:
            state.ef_search = body.ef_search
        if body.iterative_scan is not None:
            state.iterative_scan = body.iterative_scan
        return {"ef_search": state.ef_search, "iterative_scan": state.iterative_scan}

    @app.post("/v1/conversation.append", dependencies=[Depends(auth)])
    async def append(body: AppendRequest) -> dict[str, Any]:
        vec = None
        wants_vec = body.embed and body.role in EMBEDDED_ROLES
        async with state.pool.connection() as conn:
            if wants_vec:
                # The duplicate check comes first so a re-sent turn is not embedded again.
                cur = await conn.execute(sql.EXISTS, (body.namespace, body.thread_id, body.msg_id))
                if await cur.fetchone():
                    return {"stored": False, "reason": "duplicate", "embedded": False}
        if wants_vec:
            vec = await state.batcher.embed(body.content[:EMBED_CHARS])
        params = body.model_dump(exclude={"embed"})
        params["embedding"] = vec
        async with state.pool.connection() as conn:
            cur = await conn.execute(sql.APPEND, params)
            stored = cur.rowcount == 1
        if not stored:
            return {"stored": False, "reason": "duplicate", "embedded": False}
        return {"stored": True, "embedded": vec is not None}

    @app.post("/v1/conversation.search", dependencies=[Depends(auth)])
    async def search(body: SearchRequest) -> dict[str, Any]:
        if body.vector is not None:
            q = np.asarray(body.vector, dtype=np.float32)
        elif body.query:
            q = await state.batcher.embed(body.query)
        else:
            raise HTTPException(422, "query or vector is required")
        async with state.pool.connection() as conn:
            await tune(conn)
            cur = await conn.execute(
                sql.SEARCH, {"q": q, "ns": body.namespace, "k": body.k, "max_d": 1.0 - MIN_SIMILARITY}
            )
            rows = await cur.fetchall()
        return {"hits": [{"thread_id": r[0], "msg_id": r[1], "score": float(r[2])} for r in rows]}

    @app.post("/v1/conversation.search_saved_messages", dependencies=[Depends(auth)])
    async def search_saved(body: SavedSearchRequest) -> dict[str, Any]:
        q = await state.batcher.embed(body.query[:EMBED_CHARS])
        async with state.pool.connection() as conn:
            cur = await conn.execute(
                sql.SAVED_SEARCH,
                {
                    "q": q,
                    "ns": body.namespace,
                    "u": body.user_id,
                    "text": body.query,
                    "n": max(50, body.k * 5),
                    "k": body.k,
                },
            )
            rows = await cur.fetchall()
        return {"hits": [{"thread_id": r[0], "msg_id": r[1], "score": float(r[2])} for r in rows]}

    @app.post("/v1/erasure.user", dependencies=[Depends(auth)])
    async def erase_user(body: EraseRequest) -> dict[str, Any]:
        async with state.pool.connection() as conn:
            cur = await conn.execute(sql.ERASE_USER, (body.namespace, body.user_id))
            deleted = cur.rowcount
        return {"deleted": deleted}

    return app
