-- loom: writers-must-upgrade
-- (Writers of older builds write rows without the columns this adds: see runner.py.)
-- The vector tables also keep each turn's owner and time, so a search hit can be
-- answered from its vector row alone when nothing can have changed the turn since the
-- row was written (loom.store.search_marks says when: no save, unsave, re-embed,
-- deletion or compaction in the namespace since; no retention TTL due).
--
-- Rows written before this migration get '' and 1970-01-01: the marks set at the end of
-- this file put them below their namespace's mark, so search verifies them against
-- conversations, as before.
--
-- The views are replaced by new ones created before the old ones are dropped: during
-- the overlap a row reaches the table twice with the same version (harmless: the table
-- replaces by version and search keeps one candidate per version); dropping first would
-- leave a window where an insert reaches no vector table at all.

ALTER TABLE conversation_vectors_384 {on_cluster} ADD COLUMN IF NOT EXISTS user_id String AFTER run_id;

ALTER TABLE conversation_vectors_384 {on_cluster} ADD COLUMN IF NOT EXISTS ts DateTime64(6, 'UTC') AFTER user_id;

ALTER TABLE conversation_vectors_1536 {on_cluster} ADD COLUMN IF NOT EXISTS user_id String AFTER run_id;

ALTER TABLE conversation_vectors_1536 {on_cluster} ADD COLUMN IF NOT EXISTS ts DateTime64(6, 'UTC') AFTER user_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_384_feed {on_cluster} TO conversation_vectors_384 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 384 AND error = '' AND NOT tombstoned;

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_1536_feed {on_cluster} TO conversation_vectors_1536 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 1536 AND error = '' AND NOT tombstoned;

DROP VIEW IF EXISTS conversation_vectors_384_mv {on_cluster};

DROP VIEW IF EXISTS conversation_vectors_1536_mv {on_cluster};

-- conversation.search's marks (loom.store.search_marks): per thread (thread_id '' for a
-- whole namespace), the time (ns) up to which its vector rows must be verified. Every
-- namespace that holds rows now, all of them written by earlier builds without owner
-- and time in the vector tables, is marked as of this migration.
CREATE TABLE IF NOT EXISTS search_marks {on_cluster}
(
    namespace String,
    thread_id String,
    mark UInt64
)
ENGINE = ReplacingMergeTree(mark)
ORDER BY (namespace, thread_id);

INSERT INTO search_marks
SELECT DISTINCT toString(namespace), '', toUInt64(toUnixTimestamp64Nano(now64(9))) + 2000000000
FROM conversation_embeddings;
