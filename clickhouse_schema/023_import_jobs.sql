-- Imports (import.start / import.write / import.status): one row per job, revised after
-- every committed batch, so an import cut short (the client or the server stopped)
-- resumes from its last committed batch. A job is named by its namespace, its source
-- file's fingerprint and its options: the same file imported again resumes the job, or
-- starts it over once it is done. No text of the source is kept here: counts, the
-- position reached, error messages naming positions, and the window of insert times the
-- job's turns landed in (what its background embedding goes through).
CREATE TABLE IF NOT EXISTS import_jobs {on_cluster}
(
    namespace String,
    job_id String,
    source String,                              -- the file's name
    format LowCardinality(String),
    options String,                             -- JSON
    token_id String,                            -- the token that started it (its turns' appended_by)
    state LowCardinality(String),               -- running | done | stopped
    next_seq UInt32,
    position String,                            -- the client's resume point (opaque)
    units UInt64,                               -- source units (conversations, lines) read
    counts String,                              -- JSON: read, stored, duplicate, ...
    errors String,                              -- JSON: the first errors, with positions
    window_start DateTime64(3, 'UTC'),          -- the job's turns landed from here ...
    window_end DateTime64(3, 'UTC'),            -- ... to here (server insert times)
    landed_until DateTime64(3, 'UTC'),          -- every turn of its committed batches landed by then
    started_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC'),
    finished_at Nullable(DateTime64(3, 'UTC')),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, job_id);

-- An import's background embedding (the worker's, written by it alone): how far through
-- the job's window it went, and what it did.
CREATE TABLE IF NOT EXISTS import_embeddings {on_cluster}
(
    namespace String,
    job_id String,
    state LowCardinality(String),               -- pending | running | done
    position String,                            -- JSON: the last turn looked at (insert time, key)
    counts String,                              -- JSON: embedded, failed, skipped, ...
    rate Float64,                               -- turns embedded a second over its last slice
    updated_at DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, job_id);
