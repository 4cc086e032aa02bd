-- Loom's core tables. Every statement is idempotent (IF NOT EXISTS) so two processes
-- may run the migrations at once. `{on_cluster}` and the *MergeTree engines are
-- rewritten by the runner when LOOM_CLICKHOUSE_CLUSTER is set (ON CLUSTER, Replicated*).
-- Rows that are revised are ReplacingMergeTree with an explicit `version` (a
-- nanosecond clock): a revision is an insert with a higher version; reads use FINAL
-- or argMax so the newest version wins.

-- Namespaces: recording is off unless a row says otherwise (fails closed).
CREATE TABLE IF NOT EXISTS namespaces {on_cluster}
(
    namespace String,
    conversation_logging_enabled Bool DEFAULT false,
    model_calls_enabled Bool DEFAULT true,      -- the owner's switch for server-side model calls
    extraction_policy String DEFAULT '',        -- an operator's extraction policy ('' = none)
    updated_at DateTime64(3, 'UTC') DEFAULT now64(3),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY namespace;

-- Bearer tokens, stored hashed (sha256 of the secret part).
CREATE TABLE IF NOT EXISTS tokens {on_cluster}
(
    token_id String,
    token_hash String,
    namespaces Array(String),
    role LowCardinality(String),                -- viewer | writer | admin
    read_scope LowCardinality(String),          -- all | own_user | own_session
    read_user_id String,
    read_session_id String,
    label String,
    created_at DateTime64(3, 'UTC') DEFAULT now64(3),
    revoked Bool DEFAULT false,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY token_id;

-- The conversation plane: verbatim turns, kept per (namespace, agent, thread).
-- A turn is revised (saved flag, owner, tombstone) by inserting a higher version.
CREATE TABLE IF NOT EXISTS conversations {on_cluster}
(
    namespace LowCardinality(String),
    agent LowCardinality(String),
    thread_id String,
    msg_id String,
    ts DateTime64(6, 'UTC'),                    -- the message time
    role LowCardinality(String),                -- user | assistant | system | tool
    content String CODEC(ZSTD(3)),
    reasoning String CODEC(ZSTD(3)),            -- the model's reasoning, its own column
    user_id String,                             -- '' = no user owns the turn
    run_id String,
    metadata String,                            -- JSON object (compacted_from, ...)
    tokens Nullable(UInt32),
    high_sensitivity Bool,                      -- the whole text reads as high
    is_summary Bool DEFAULT false,              -- a compaction's summary (embedded system turn)
    is_saved Bool DEFAULT false,
    saved_at Nullable(DateTime64(3, 'UTC')),    -- when the user saved it
    tombstoned Bool DEFAULT false,
    tombstoned_at Nullable(DateTime64(3, 'UTC')),
    tombstone_reason LowCardinality(String) DEFAULT '',  -- deleted | compacted | unsaved | erased
    created_at DateTime64(3, 'UTC') DEFAULT now64(3),
    version UInt64,
    INDEX idx_user user_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_run run_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, agent, thread_id, msg_id)
SETTINGS non_replicated_deduplication_window = 10000;

-- One embedding row per (namespace, thread, msg_id): agents that log the same turn
-- share it, so the row names the copy it currently serves (agent, role, run, user).
-- `text` is what the vector was built from: the first 2,048 characters, or 240 for
-- rows written by earlier builds (a re-embed starts from it). No TTL, ever.
CREATE TABLE IF NOT EXISTS conversation_embeddings {on_cluster}
(
    namespace LowCardinality(String),
    thread_id String,
    msg_id String,
    agent LowCardinality(String),
    role LowCardinality(String),
    run_id String,
    user_id String,
    ts DateTime64(6, 'UTC'),
    text String CODEC(ZSTD(3)),
    embedding Array(Float32) CODEC(ZSTD(1)),
    model LowCardinality(String),
    error String,                               -- non-empty: the embed failed (fail-open)
    is_summary Bool DEFAULT false,
    is_saved Bool DEFAULT false,
    saved_at Nullable(DateTime64(3, 'UTC')),
    tombstoned Bool DEFAULT false,
    created_at DateTime64(3, 'UTC') DEFAULT now64(3),
    version UInt64,
    INDEX idx_user user_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, thread_id, msg_id)
SETTINGS non_replicated_deduplication_window = 10000;

-- Threads: a row per (namespace, agent, thread), created by the first append.
-- metadata carries marks such as title_refused.
CREATE TABLE IF NOT EXISTS threads {on_cluster}
(
    namespace LowCardinality(String),
    agent LowCardinality(String),
    thread_id String,
    title String,
    metadata String,
    run_id String,
    created_at DateTime64(6, 'UTC'),
    updated_at DateTime64(3, 'UTC') DEFAULT now64(3),
    tombstoned Bool DEFAULT false,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, agent, thread_id);

-- Session briefs: the current state of each brief (one row per key, revised).
CREATE TABLE IF NOT EXISTS session_briefs {on_cluster}
(
    namespace LowCardinality(String),
    brief_key String,                           -- as stored (with a ~user~ prefix when bounded)
    project String,
    branch String,
    session_id String,
    user_id String,
    agent LowCardinality(String),
    revision UInt32,
    sections String CODEC(ZSTD(3)),             -- JSON object of the brief's sections
    author LowCardinality(String),              -- llm | deterministic | model
    last_session_id String,
    last_event_cursor String,
    last_summary String CODEC(ZSTD(3)),         -- the client's own last compaction summary
    created_at DateTime64(3, 'UTC') DEFAULT now64(3),
    updated_at DateTime64(3, 'UTC') DEFAULT now64(3),
    deleted Bool DEFAULT false,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, brief_key);

-- Every revision of every brief, kept.
CREATE TABLE IF NOT EXISTS session_brief_revisions {on_cluster}
(
    namespace LowCardinality(String),
    brief_key String,
    revision UInt32,
    project String,
    branch String,
    session_id String,
    user_id String,
    agent LowCardinality(String),
    token_id String,                            -- the token that wrote this revision (mine_only)
    sections String CODEC(ZSTD(3)),
    author LowCardinality(String),
    event_cursor String,
    last_summary String CODEC(ZSTD(3)),         -- the client's last compaction summary as of this revision
    created_at DateTime64(3, 'UTC') DEFAULT now64(3),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, brief_key, revision);
