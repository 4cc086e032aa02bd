-- The embedding recovery pass (loom.ops.conversation.recovery) looks, once a minute,
-- for user and assistant turns that landed without an embedding row (a crash between a
-- flush's insert and its embedding). It reads only the turns that landed since its last
-- position: a minmax index on created_at (the server's insert time) lets it skip every
-- granule older than that, so a pass costs the recent parts and the granules of
-- recently active threads, not a scan of the table.
ALTER TABLE conversations {on_cluster} ADD INDEX IF NOT EXISTS idx_created created_at TYPE minmax GRANULARITY 1;

ALTER TABLE conversations {on_cluster} MATERIALIZE INDEX idx_created;

-- Where the pass stopped: every turn at or before this (created_at, key) position was
-- looked at. One row, revised by version; no row yet: from the beginning.
CREATE TABLE IF NOT EXISTS embed_recovery {on_cluster}
(
    name String,
    created_at DateTime64(3, 'UTC'),
    namespace String,
    agent String,
    thread_id String,
    msg_id String,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY name;
