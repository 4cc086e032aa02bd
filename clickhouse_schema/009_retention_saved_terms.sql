-- Retention reaches the saved-message indexes: every derived table that holds a
-- transcript's text or terms must not outlive the transcript row it came from. saved_docs
-- has the message time (ts) already; saved_terms, the postings, get it here, so both can
-- carry the same TTL as loom.conversations (set at start-up with it:
-- clickhouse_schema.runner.apply_storage_rules).
--
-- Postings written before this migration get the epoch as their time; they are written
-- again below from saved_docs with the message time (saved_terms keeps the last row
-- inserted per key), and a posting of a text no longer saved leaves at the first TTL
-- merge. The view is replaced by a new one created before the old one is dropped (as in
-- 006: during the overlap a posting may reach the table twice, which the engine collapses).

ALTER TABLE saved_terms {on_cluster} ADD COLUMN IF NOT EXISTS ts DateTime64(6, 'UTC') DEFAULT toDateTime64(0, 6, 'UTC');

CREATE MATERIALIZED VIEW IF NOT EXISTS saved_terms_feed {on_cluster} TO saved_terms AS
SELECT namespace, user_id, term, cityHash64(thread_id, msg_id, agent, content) AS doc, toUInt32(count()) AS tf,
       max(ts) AS ts
FROM saved_feed
ARRAY JOIN arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))) AS term
WHERE is_saved AND NOT tombstoned AND NOT high_sensitivity
GROUP BY namespace, user_id, term, doc;

DROP VIEW IF EXISTS saved_terms_mv {on_cluster};

INSERT INTO saved_terms (namespace, user_id, term, doc, tf, ts)
SELECT namespace, user_id, term, doc, toUInt32(count()) AS tf, max(ts) AS ts
FROM saved_docs FINAL
ARRAY JOIN arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))) AS term
WHERE is_saved AND NOT tombstoned AND NOT high_sensitivity
GROUP BY namespace, user_id, term, doc;
