-- conversation.search's vector tables: the live vectors of loom.conversation_embeddings
-- under an HNSW index (ClickHouse's vector_similarity), one table per dimension,
-- because an HNSW index holds vectors of exactly one length.
--
-- Kept by ClickHouse itself: a materialized view copies every row inserted into
-- conversation_embeddings that carries a vector of the table's length, so every writer
-- (append's embedding write, reembed, saves, deletion, a bulk loader) keeps it current
-- without knowing it exists. It is an index, never the truth: a tombstone or a failed
-- embed has no vector and never enters, so the table still holds the older version
-- of such a row; a re-embed adds a newer version beside the old one until a merge
-- replaces it. Every candidate a search reads here is therefore checked against the
-- newest row of conversation_embeddings (same `version`, live, with a vector) and of
-- loom.conversations (live, not high) before it is returned.
--
-- Dimensions: 384 (all-MiniLM-L6-v2, the default embedder) and 1536 (OpenAI's
-- text-embedding-3-small and ada-002). Vectors of any other length are searched
-- exactly over conversation_embeddings (correct, but a scan of the namespace); to index
-- another length, add a migration with the two statements below for it.
--
-- Layout: ORDER BY (namespace, thread_id, msg_id) with small granules (64 rows), so an
-- exact scan of one namespace or thread reads only its own rows, and the few rows a
-- search reads back (ClickHouse reads whole granules) cost little; the HNSW index
-- (bf16, M=16, one graph per part) serves large namespaces. A filter ClickHouse can evaluate on
-- the primary key makes it fall back to an exact scan of the surviving ranges, so the
-- index query hides the key columns behind identity() (see loom/store/search.py).
-- Vectors are not compressed (dense floats do not compress; decompression would only
-- slow the scan).

CREATE TABLE IF NOT EXISTS conversation_vectors_384 {on_cluster}
(
    namespace LowCardinality(String),
    thread_id String,
    msg_id String,
    version UInt64,                             -- the conversation_embeddings row this copies
    agent LowCardinality(String),
    role LowCardinality(String),
    run_id String,
    text String,                                -- what the vector was built from (a hit's excerpt)
    embedding Array(Float32) CODEC(NONE),
    INDEX ann embedding TYPE vector_similarity('hnsw', 'cosineDistance', 384, 'bf16', 16, 0) GRANULARITY 100000000
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, thread_id, msg_id)
SETTINGS index_granularity = 64;

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_384_mv {on_cluster} TO conversation_vectors_384 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 384 AND error = '' AND NOT tombstoned;

CREATE TABLE IF NOT EXISTS conversation_vectors_1536 {on_cluster}
(
    namespace LowCardinality(String),
    thread_id String,
    msg_id String,
    version UInt64,
    agent LowCardinality(String),
    role LowCardinality(String),
    run_id String,
    text String,
    embedding Array(Float32) CODEC(NONE),
    INDEX ann embedding TYPE vector_similarity('hnsw', 'cosineDistance', 1536, 'bf16', 16, 0) GRANULARITY 100000000
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, thread_id, msg_id)
SETTINGS index_granularity = 64;

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_1536_mv {on_cluster} TO conversation_vectors_1536 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 1536 AND error = '' AND NOT tombstoned;

-- Rows written before this migration (the views see only new inserts).
INSERT INTO conversation_vectors_384
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, text, embedding
FROM conversation_embeddings FINAL
WHERE length(embedding) = 384 AND error = '' AND NOT tombstoned;

INSERT INTO conversation_vectors_1536
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, text, embedding
FROM conversation_embeddings FINAL
WHERE length(embedding) = 1536 AND error = '' AND NOT tombstoned;
