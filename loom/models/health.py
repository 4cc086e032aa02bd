"""Request and response of health.show (see loom.ops.platform.health for what each figure means)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from loom.models.common import RequestBody


class HealthShowRequest(RequestBody):
    pass


class BackendsOut(BaseModel):
    clickhouse: str = Field(description='"ok" or "down: <kind of failure>".')
    redis: str = Field(description='"ok" or "down: <kind of failure>".')
    clickhouse_version: str | None = Field(None, description="The server's version (None: it is down).")
    clickhouse_uptime_s: int | None = Field(None, description="Seconds since the server started.")


class QueueOut(BaseModel):
    name: str = Field(description="The job queue (arq's sorted set) the API and the workers share.")
    queued: int = Field(description="Jobs in the queue not running yet (deferred ones included).")
    deferred: int = Field(description="Of the queued jobs, those not due yet (a deferral or a retry's wait).")
    in_progress: int = Field(description="Jobs a worker is running.")
    in_progress_at_least: bool = Field(
        description="The due jobs looked at were capped: `in_progress` is this many or more."
    )
    oldest_waiting_s: float | None = Field(
        description="Seconds the longest-waiting due job (not running) has waited; None: none waits."
    )
    failed: int = Field(description="Jobs of this queue that failed in the last `results_window_s` seconds.")
    succeeded: int = Field(description="Jobs that succeeded in the last `results_window_s` seconds.")
    results_at_least: bool = Field(
        description="The result scan stopped at its cost cap: `failed` and `succeeded` are these or more."
    )
    results_window_s: int = Field(description="How long a finished job's result is kept (and counted).")


class EmbeddingCountOut(BaseModel):
    status: str = Field(description="embedded, failed, tombstoned or no_vector.")
    code: str = Field(description="For failed: the failure's code (e.g. embedder_timeout); else ''.")
    rows: int


class EmbeddingsOut(BaseModel):
    append_outcomes: dict[str, int] = Field(
        description="Turns appended through this API process since it started, by outcome "
        "(stored, duplicate, logging_disabled, deleted, ...)."
    )
    embedding_outcomes: dict[str, int] = Field(
        description="The same turns by the embedding outcome the append answered "
        "(embedded, failed, skipped:<why>)."
    )
    rows_window_s: int = Field(description="The window of `rows`, in seconds.")
    rows: list[EmbeddingCountOut] | None = Field(
        description="Embedding rows the token's namespaces had written in the window, by outcome "
        "(row writes: a revision counts again). None: ClickHouse did not answer."
    )


class RatesOut(BaseModel):
    window_s: float = Field(description="What the rates are over (0: no earlier reading yet, no rates).")
    append_requests_per_s: float | None
    turns_stored_per_s: float | None
    searches_per_s: float | None = Field(
        description="conversation.search and conversation.search_saved_messages requests per second."
    )


class ReadIndexOut(BaseModel):
    state: str = Field(description='"ok", "off" (no read index runs) or "down" (it does not answer).')
    bytes: int = Field(description="Memory it holds: vectors, texts and rows.")
    budget_bytes: int = Field(description="LOOM_READ_INDEX_MB, in bytes.")
    rows: int = Field(description="Vectors it holds.")
    namespaces: int = Field(description="Namespaces it holds (the others are searched in the engine).")
    loading: int = Field(description="Namespaces being read from ClickHouse, or waiting to be.")
    lag_p50_ms: float = Field(description="Median time from a write event's publication to its application.")
    lag_p99_ms: float = Field(description="99th percentile of the same (over its last 10,000 events).")
    searches: int = Field(description="Searches it answered since its process started.")
    hit_rate: float | None = Field(
        description="Of the namespaces those searches named, the share it held (None: no search yet)."
    )


class HealthShowResponse(BaseModel):
    status: str = Field(description='"ok", or "degraded" when a backend is down.')
    backends: BackendsOut
    queue: QueueOut | None = Field(description="None: Redis did not answer.")
    embeddings: EmbeddingsOut
    rates: RatesOut
    read_index: ReadIndexOut
