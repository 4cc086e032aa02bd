-- loom: writers-must-upgrade
-- (Writers of older builds write vector rows without the column this adds: see runner.py.)
-- The vector tables of conversation.search say which model made each vector, and keep
-- one row per turn AND model.
--
-- Two bundled models (MiniLM, e5-small) both make 384-dimension vectors and share
-- conversation_vectors_384; vectors of two models are not comparable, so a search
-- compares its query only with vectors of the query's own model (`model`), and
-- `loom reembed --model` builds a namespace's vectors of another model beside the ones
-- search uses meanwhile (rows of that model written straight into these tables, each
-- carrying the version of the embedding row whose text it embeds: loom.store.vector_models).
-- With `model` at the end of the sorting key the two rows of one turn are two rows,
-- and a re-embed of one model never replaces the other's.
--
-- ClickHouse lets a sorting key grow only by a column added in the same statement, and
-- one without a default expression.
-- Rows written before this migration read '' (their model is the one their embedding
-- row names: search checks it there, loom.store.search.verify_embeddings).
ALTER TABLE conversation_vectors_384 {on_cluster}
    ADD COLUMN IF NOT EXISTS model LowCardinality(String) AFTER version,
    MODIFY ORDER BY (namespace, thread_id, msg_id, model);
ALTER TABLE conversation_vectors_1536 {on_cluster}
    ADD COLUMN IF NOT EXISTS model LowCardinality(String) AFTER version,
    MODIFY ORDER BY (namespace, thread_id, msg_id, model);

-- The feeds, replaced by ones that copy the model (new views first, then the old ones
-- dropped: see migration 006 for why that order).
CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_384_by_model {on_cluster} TO conversation_vectors_384 AS
SELECT namespace, thread_id, msg_id, version, model, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 384 AND error = '' AND NOT tombstoned AND origin = 'recorded';

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_1536_by_model {on_cluster} TO conversation_vectors_1536 AS
SELECT namespace, thread_id, msg_id, version, model, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 1536 AND error = '' AND NOT tombstoned AND origin = 'recorded';

DROP VIEW IF EXISTS conversation_vectors_384_recorded {on_cluster};

DROP VIEW IF EXISTS conversation_vectors_1536_recorded {on_cluster};
