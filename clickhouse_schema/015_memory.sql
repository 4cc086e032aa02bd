-- The memory plane: durable facts (loom.memories) and the messages and observations an
-- extraction read (loom.memory_evidence), both per (namespace, user). Rows are revised
-- by inserting a newer version (ReplacingMergeTree(version)); a forgotten row is a
-- tombstone version, so an older version can never reappear. Nothing here is fed from
-- the conversation plane: a recorded turn never becomes a fact or evidence by itself.
--
-- Each base table carries its BM25 document id and length as MATERIALIZED columns, and
-- a materialized view writes the postings of every live version into its term table
-- (the same tokeniser as loom.store.bm25.TERMS and 003_saved.sql). The postings only
-- propose candidates; a query joins them to the scope's live rows (FINAL), which is
-- also where N and avgdl come from, so the statistics are per query and per scope.

CREATE TABLE IF NOT EXISTS memories {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    memory_id String,
    session_id String,
    run_id String,
    kind LowCardinality(String),
    key String,                                 -- '' or the upsert key (memory_id derives from it)
    text String CODEC(ZSTD(3)),
    source LowCardinality(String),              -- set | extraction | crystallize
    evidence_ids Array(String),                 -- the evidence an extraction decided from
    created_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC'),
    tombstoned Bool,
    model LowCardinality(String),               -- the embedder that made `embedding` ('' when none)
    embedding Array(Float32) CODEC(NONE),       -- unit-normalised; empty when the embed failed
    embed_error String,                         -- '<code>: <message>' of a failed embed, else ''
    version UInt64,
    doc UInt64 MATERIALIZED cityHash64(memory_id, text),
    doc_len UInt32 MATERIALIZED toUInt32(length(arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(text), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(text), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+')))))
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, user_id, memory_id)
SETTINGS index_granularity = 1024;

CREATE TABLE IF NOT EXISTS memory_terms {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    term String,
    doc UInt64,
    tf UInt32
)
ENGINE = ReplacingMergeTree
ORDER BY (namespace, user_id, term, doc)
SETTINGS index_granularity = 256;

CREATE MATERIALIZED VIEW IF NOT EXISTS memory_terms_mv {on_cluster} TO memory_terms AS
SELECT namespace, user_id, term, cityHash64(memory_id, text) AS doc, toUInt32(count()) AS tf
FROM memories
ARRAY JOIN arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(text), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(text), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))) AS term
WHERE NOT tombstoned
GROUP BY namespace, user_id, term, doc;

-- One row per message or observation an extraction read. A message that reads as high
-- keeps its place (role, time, id) but no text: content is '' and high_sensitivity true.
CREATE TABLE IF NOT EXISTS memory_evidence {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    evidence_id String,
    session_id String,
    run_id String,
    source LowCardinality(String),              -- messages | observation
    msg_id String,
    role LowCardinality(String),
    content String CODEC(ZSTD(3)),
    high_sensitivity Bool,
    ts DateTime64(6, 'UTC'),                    -- when it was said (the time-window reads use it)
    created_at DateTime64(3, 'UTC'),
    tombstoned Bool,
    version UInt64,
    doc UInt64 MATERIALIZED cityHash64(evidence_id, content),
    doc_len UInt32 MATERIALIZED toUInt32(length(arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+')))))
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, user_id, evidence_id)
SETTINGS index_granularity = 1024;

CREATE TABLE IF NOT EXISTS evidence_terms {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    term String,
    doc UInt64,
    tf UInt32
)
ENGINE = ReplacingMergeTree
ORDER BY (namespace, user_id, term, doc)
SETTINGS index_granularity = 256;

CREATE MATERIALIZED VIEW IF NOT EXISTS evidence_terms_mv {on_cluster} TO evidence_terms AS
SELECT namespace, user_id, term, cityHash64(evidence_id, content) AS doc, toUInt32(count()) AS tf
FROM memory_evidence
ARRAY JOIN arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))) AS term
WHERE NOT tombstoned AND NOT high_sensitivity
GROUP BY namespace, user_id, term, doc;

-- Every decision an extraction took (add, update, delete, leave), with the evidence it
-- came from: the audit trail of how a fact came to be, changed or forgotten.
CREATE TABLE IF NOT EXISTS memory_decisions {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    extraction_id String,
    seq UInt32,
    action LowCardinality(String),              -- add | update | delete | leave
    memory_id String,
    text String CODEC(ZSTD(3)),                 -- the fact as decided ('' for delete and leave)
    evidence_ids Array(String),
    created_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (namespace, user_id, extraction_id, seq);
