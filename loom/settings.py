"""Every setting Loom reads, with its documented name and default.

All are environment variables prefixed ``LOOM_``. A bad value fails start-up with a
message naming the variable (see :func:`load_settings`). LOOM_HOME is made absolute
when the settings load (against the working directory of the process that loads them),
so every path under it stays valid whatever directory a child process or a server
(redis-server changes into its --dir before it opens its --logfile) works in.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(RuntimeError):
    """A LOOM_* variable holds a value Loom cannot use."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOOM_", extra="ignore", frozen=True)

    # Where the embedded engine, Redis and their files live.
    home: Path = Path("./.loom")

    # ClickHouse: empty URL means "start or find the embedded endpoint under LOOM_HOME".
    clickhouse_url: str = ""
    clickhouse_user: str = "default"
    clickhouse_password: str = ""
    clickhouse_database: str = "loom"
    clickhouse_cluster: str = ""
    # The embedded engine's caches (marks, primary and vector indexes, ...) together stay
    # under this many MiB (loom.embedded.clickhouse_endpoint.engine_cache_settings).
    clickhouse_cache_mb: int = Field(2048, ge=16)

    # Redis: empty URL means "start or find the embedded redis-server under LOOM_HOME".
    redis_url: str = ""

    # The API.
    host: str = "127.0.0.1"
    port: int = Field(7777, ge=1, le=65535)
    # The largest request body the API reads (413 beyond it, before reading). A batch
    # of 500 turns of a few kilobytes each fits with room to spare.
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)

    # memory.search keeps each searched user's facts in the API process while they are
    # current (loom.ops.memory.scan_cache), within this many MiB; 0 turns it off.
    memory_search_cache_mb: int = Field(64, ge=0)
    # A user above the one read's cap (thousands of facts) is searched from an index of
    # their facts kept in the API process (loom.ops.memory.large_scope): ~1.6 KB a fact
    # with 384-dim vectors (100k facts: ~170 MiB), within this many MiB; 0 turns it off
    # (such users are then ranked by the server, ~150 ms a search at 100k facts).
    memory_large_scope_cache_mb: int = Field(256, ge=0)

    # The read index (loom.read_index): one process `loom serve` supervises holds the
    # conversation plane's live vectors in memory, within this many MiB (least recently
    # searched namespaces leave first and are searched by the engine); 0: no index, every
    # search reads the engine. ~3.9 KB a 384-dimension turn of ~200 characters (float32
    # vector, excerpt, Python rows): the default holds ~500k turns.
    read_index_mb: int = Field(2048, ge=0)
    # Where the API finds the index's socket; `loom serve` sets it for its API. Empty:
    # no index runs, searches read the engine (and say nothing about it).
    read_index_socket: str = ""

    # Conversation plane (seed: "Settings").
    conversation_search_min_similarity: float = Field(0.30, ge=-1.0, le=1.0)
    conversation_search_excerpt_chars: int = Field(240, ge=1, le=100_000)
    # conversation.search scans a namespace's vectors exactly up to this many rows (after
    # filters) and uses the HNSW index above it (see loom/store/search.py). Measured on an
    # idle 2-core box (bench/results/2026-12-01-1014-search.txt, 2026-12-01): exact 15 ms at 4.5k rows, 56-63
    # ms at 41k-89k; the index 19-24 ms at any size, so the two cross near 8-10k rows.
    conversation_search_exact_max_rows: int = Field(10_000, ge=0)
    conversation_titler_enabled: bool = True
    conversation_titler_window_hours: int = Field(168, ge=1)
    conversation_titler_min_turns: int = Field(4, ge=1)
    conversation_titler_max_threads_per_pass: int = Field(10, ge=1)
    conversation_titler_interval_seconds: int = Field(300, ge=10, le=86_400)
    # conversation.compact: how many characters of turns one summarizer prompt carries,
    # and the separate allowance for the earlier summaries folded in at its start.
    compact_prompt_budget_chars: int = Field(24_000, ge=1_000)
    compact_summary_allowance_chars: int = Field(6_000, ge=0)
    # How long conversation.compact (without defer) awaits its job before answering 503.
    compact_wait_seconds: float = Field(120.0, gt=0)
    # Compactions whose store work (the window read, the retirement) runs at once in one
    # worker process; the others wait for a turn (their summarizer calls do not). The
    # embedding jobs of appends share the process and the engine: bounded, compactions
    # cannot crowd them out (loom.ops.conversation.lifecycle.compaction_gate).
    compact_concurrency: int = Field(1, ge=1, le=256)
    # After a compaction's store step of t seconds the next one waits pace x t: a queue
    # of compactions keeps the engine at most 1 / (1 + pace) busy. 0: back to back.
    compact_pace: float = Field(1.0, ge=0, le=100)

    # Retention and tiering of loom.conversations (0 = keep forever / no move).
    retention_conversations_days: int = Field(0, ge=0)
    tiering_conversations_warm_days: int = Field(0, ge=0)

    # Session briefs.
    session_brief_llm: bool = True
    session_brief_llm_model: str = ""
    session_brief_llm_api_key: str = ""
    session_brief_llm_url: str = ""  # where the brief model is served; default LOOM_LLM_URL
    session_brief_window_chars: int = Field(24_000, ge=1_000)
    session_brief_max_windows: int = Field(4, ge=1, le=64)

    mcp_session_run_idle_seconds: int = Field(1800, ge=1)

    # Providers: embedder (minilm | e5-small | openai | fake) and LLM (fake | openai).
    embedder: Literal["minilm", "e5-small", "openai", "fake"] = "minilm"
    embedder_url: str = ""
    embedder_model: str = ""
    embedder_api_key: str = ""
    embedder_timeout_seconds: float = Field(10.0, gt=0)
    embed_wait_seconds: float = Field(15.0, gt=0)  # append's bounded wait for its embedding
    # The embedding model reads a turn behind its speaker ("User: ...", "Assistant: ...",
    # "Summary: ..."); the rows keep the text as it was. Vectors written before a change
    # keep the old input until conversation.reembed (see docs/search.md).
    embed_speaker_prefix: bool = False
    # The embedding recovery pass (loom.ops.embedding.recovery): a user or assistant
    # turn inserted this long ago with no embedding row at all is embedded by it (never
    # less than LOOM_EMBED_WAIT_SECONDS + 5 s: see recovery_grace_seconds); it runs at
    # worker start-up and every interval.
    embed_recovery_grace_seconds: float = Field(60.0, gt=0)
    embed_recovery_interval_seconds: int = Field(60, ge=1, le=3600)
    # Diagnosis only (loom.memtrace): tracemalloc dumps of the API and the worker; empty is off.
    memtrace_dir: str = ""
    memtrace_every_s: float = Field(120.0, gt=0)
    memtrace_frames: int = Field(8, ge=1, le=100)
    llm: Literal["fake", "openai"] = "fake"
    llm_url: str = ""
    llm_model: str = ""
    llm_api_key: str = ""
    llm_timeout_seconds: float = Field(60.0, gt=0)

    # Write path batching.
    write_batch_max_rows: int = Field(2_000, ge=1)
    write_batch_max_wait_ms: float = Field(4.0, ge=0)
    # User and assistant turns wait for their embedding (a model call of tens of ms)
    # anyway: a longer window gathers a whole round of concurrent appends into one
    # flush, so one insert and one embedding job instead of several.
    write_batch_embed_wait_ms: float = Field(20.0, ge=0)
    # ... but once arrivals pause this long, the round is in: flush without waiting out
    # the rest of the window (0 turns the pause rule off).
    write_batch_embed_quiet_ms: float = Field(3.0, ge=0)

    # Webhooks (loom.ops.webhooks): attempts per delivery (the first included), the wait
    # before the second (doubled before each next one), and each POST's timeout.
    webhook_max_attempts: int = Field(5, ge=1, le=20)
    webhook_backoff_seconds: float = Field(30.0, gt=0, le=3600)
    webhook_timeout_seconds: float = Field(5.0, gt=0, le=60)

    log_level: str = "INFO"
    # The libraries' routine lines too (requests, job starts and ends, MCP sessions) and
    # Loom's debug lines; `loom serve --verbose` sets it for every process it starts.
    log_verbose: bool = False

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, home: Path) -> Path:
        # Once, here: every path derived from it (settings.home / ...) is then absolute
        # too, and children get it in LOOM_HOME as it was resolved.
        return home.expanduser().resolve()

    @property
    def recovery_grace_seconds(self) -> float:
        """The recovery pass's grace as applied. An append's job writes its vectors up to
        this less 5 s of clock skew (RECOVERY_CLOCK_MARGIN_S in
        loom.ops.embedding.writer), which must not cut short the append's own
        wait for them."""
        return max(self.embed_recovery_grace_seconds, self.embed_wait_seconds + 5.0)

    @property
    def clickhouse_embedded(self) -> bool:
        return not self.clickhouse_url

    @property
    def redis_embedded(self) -> bool:
        return not self.redis_url


def load_settings() -> Settings:
    """Read the environment, turning a validation error into one line per bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            lines.append(f"LOOM_{field.upper()}: {err['msg']} (got {err.get('input')!r})")
        raise SettingsError("invalid Loom settings:\n  " + "\n  ".join(lines)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
