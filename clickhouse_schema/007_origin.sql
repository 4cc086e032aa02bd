-- loom: writers-must-upgrade
-- (Writers of older builds write rows without the columns this adds: see runner.py.)
-- How each transcript row came to exist: `origin`.
--
--   'recorded'  an append or an ingest stored it (the namespace recorded the turn), or
--               a later append of the same turn, while the namespace records, took
--               over a row a save had stored;
--   'saved'     only conversation.save_message stored it (the message was new to the
--               transcript). Such a row belongs to the user who saved it: the
--               saved-message ops (and erasure.export) serve it, conversation.search,
--               threads, get and list never do, and unsaving removes it.
--
-- The embedding row carries the origin of the transcript copy it serves, so the vector
-- tables of conversation.search take only vectors of recorded turns (the feeds below);
-- the per-user saved indexes of migration 003 take both.
--
-- Rows written before this migration (every one reads 'recorded' from the column's
-- default) are sorted by one rule: a row whose newest version is saved, in a thread
-- (namespace, agent, thread_id) that holds no row whose newest version is unsaved
-- (live or tombstoned: a recorded turn), counts as saved-only. Earlier builds stored a
-- message that the transcript did not hold only by a save, and a thread they recorded
-- holds turns nobody saved; a recorded thread whose every turn is saved is taken as
-- saved-only, the private reading. Such rows get a new version (version + 1) with
-- origin 'saved', and so do the embedding rows serving them. Running it again changes
-- nothing (only rows still reading 'recorded' are revised).

ALTER TABLE conversations {on_cluster} ADD COLUMN IF NOT EXISTS origin LowCardinality(String) DEFAULT 'recorded';

ALTER TABLE conversation_embeddings {on_cluster} ADD COLUMN IF NOT EXISTS origin LowCardinality(String) DEFAULT 'recorded';

-- The vector tables' feeds, replaced by ones that take recorded vectors only (new views
-- first, then the old ones dropped: see migration 006 for why that order).
CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_384_recorded {on_cluster} TO conversation_vectors_384 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 384 AND error = '' AND NOT tombstoned AND origin = 'recorded';

CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_vectors_1536_recorded {on_cluster} TO conversation_vectors_1536 AS
SELECT namespace, thread_id, msg_id, version, agent, role, run_id, user_id, ts, text, embedding
FROM conversation_embeddings
WHERE length(embedding) = 1536 AND error = '' AND NOT tombstoned AND origin = 'recorded';

DROP VIEW IF EXISTS conversation_vectors_384_feed {on_cluster};

DROP VIEW IF EXISTS conversation_vectors_1536_feed {on_cluster};

-- Existing saved-only rows (the rule above).
INSERT INTO conversations (namespace, agent, thread_id, msg_id, ts, role, content, reasoning, user_id, run_id,
                           metadata, tokens, high_sensitivity, is_summary, is_saved, saved_at, tombstoned,
                           tombstoned_at, tombstone_reason, origin, version)
SELECT namespace, agent, thread_id, msg_id, ts, role, content, reasoning, user_id, run_id, metadata, tokens,
       high_sensitivity, is_summary, is_saved, saved_at, tombstoned, tombstoned_at, tombstone_reason, 'saved',
       version + 1
FROM conversations FINAL
WHERE is_saved AND origin = 'recorded'
  AND (namespace, agent, thread_id) IN (
      -- the threads whose every row is saved (a small set: not every thread of the table)
      SELECT namespace, agent, thread_id FROM conversations FINAL
      GROUP BY namespace, agent, thread_id HAVING countIf(NOT is_saved) = 0);

INSERT INTO conversation_embeddings (namespace, thread_id, msg_id, agent, role, run_id, user_id, ts, text, embedding,
                                     model, error, is_summary, is_saved, saved_at, tombstoned, origin, version)
SELECT namespace, thread_id, msg_id, agent, role, run_id, user_id, ts, text, embedding, model, error, is_summary,
       is_saved, saved_at, tombstoned, 'saved', version + 1
FROM conversation_embeddings FINAL
WHERE origin = 'recorded'
  AND (namespace, agent, thread_id, msg_id) IN (
      SELECT namespace, agent, thread_id, msg_id FROM conversations FINAL WHERE origin = 'saved');

-- The vector tables may still hold these rows' vectors: search verifies every vector row
-- of those namespaces written before now (loom.store.search_marks), and verification
-- drops a row whose transcript copy is not recorded.
INSERT INTO search_marks
SELECT DISTINCT toString(namespace), '', toUInt64(toUnixTimestamp64Nano(now64(9))) + 2000000000
FROM conversations
WHERE origin = 'saved';
