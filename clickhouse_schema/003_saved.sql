-- Saved messages (conversation.save_message and its reads): per-user indexes kept by
-- ClickHouse itself. Each is fed by materialized views from inserts into the base
-- tables, so every writer (save, unsave, append's embedding write, deletion,
-- compaction, a direct INSERT of an earlier build) keeps them current without
-- knowing they exist. They are indexes, never the truth: every read that answers a
-- client re-checks its rows against loom.conversations (a lightweight DELETE or a TTL
-- does not pass through a view; a row the index still holds is then dropped).
--
-- A row enters an index while it is or was saved (`is_saved OR saved_at IS NOT NULL`):
-- a revision that clears the flag or tombstones the turn keeps `saved_at`, so it
-- reaches the index and retires the older version there.
--
-- The tokeniser below must stay identical to loom.store.bm25.TERMS (a test checks):
-- lowercased runs of letters and digits, plus the compound tokens they form with
-- - _ . / : @ # (a ticket id "inc-48213", a table "billing_ledger_v2", a host), each
-- at most 64 characters.

-- The saved rows of every insert into loom.conversations, passed on (a Null table
-- keeps nothing): the one view on the transcript's hot insert path is a cheap filter,
-- and the tokeniser runs only on saved rows, in the views below.
CREATE TABLE IF NOT EXISTS saved_feed {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    thread_id String,
    msg_id String,
    agent LowCardinality(String),
    role LowCardinality(String),
    ts DateTime64(6, 'UTC'),
    saved_at Nullable(DateTime64(3, 'UTC')),
    is_saved Bool,
    tombstoned Bool,
    high_sensitivity Bool,
    content String,
    version UInt64
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS saved_feed_mv {on_cluster} TO saved_feed AS
SELECT namespace, user_id, thread_id, msg_id, agent, role, ts, saved_at, is_saved, tombstoned, high_sensitivity,
       content, version
FROM conversations
WHERE user_id != '' AND (is_saved OR saved_at IS NOT NULL);

-- One row per saved transcript row (per agent copy): what a listing pages through,
-- what BM25's statistics (N, avgdl) are computed from, and the text a hit's excerpt is
-- cut from. The text is kept here, in small granules in the user's key range, because
-- a page of hits lies in as many granules of loom.conversations (8,192 rows of text
-- each) as it has threads; the transcript is still asked, without its text, whether
-- each row is saved and live.
CREATE TABLE IF NOT EXISTS saved_docs {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    thread_id String,
    msg_id String,
    agent LowCardinality(String),
    role LowCardinality(String),
    ts DateTime64(6, 'UTC'),
    saved_at Nullable(DateTime64(3, 'UTC')),
    is_saved Bool,
    tombstoned Bool,
    high_sensitivity Bool,
    doc UInt64,                                 -- this copy and text: what its postings name
    doc_len UInt32,                             -- terms in the whole text (BM25's document length)
    content String CODEC(ZSTD(3)),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, user_id, thread_id, msg_id, agent)
SETTINGS index_granularity = 256;

CREATE MATERIALIZED VIEW IF NOT EXISTS saved_docs_mv {on_cluster} TO saved_docs AS
SELECT namespace, user_id, thread_id, msg_id, agent, role, ts, saved_at, is_saved, tombstoned, high_sensitivity,
       cityHash64(thread_id, msg_id, agent, content) AS doc,
       toUInt32(length(arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))))) AS doc_len,
       content, version
FROM saved_feed;

-- The inverted index of saved texts (the whole text, not the embedded 2,048
-- characters): one posting per (user, term, doc), doc naming the message copy and its
-- text. A text's postings never change, so they are written when a live saved row
-- passes and carry no liveness; a query joins them to the live rows of saved_docs.
-- Small granules: a query reads a few terms' postings, not their neighbours'.
CREATE TABLE IF NOT EXISTS saved_terms {on_cluster}
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

CREATE MATERIALIZED VIEW IF NOT EXISTS saved_terms_mv {on_cluster} TO saved_terms AS
SELECT namespace, user_id, term, cityHash64(thread_id, msg_id, agent, content) AS doc, toUInt32(count()) AS tf
FROM saved_feed
ARRAY JOIN arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))) AS term
WHERE is_saved AND NOT tombstoned AND NOT high_sensitivity
GROUP BY namespace, user_id, term, doc;

-- The vectors of saved messages, per user (the vector leg reads one user's range, not
-- every embedding of the namespace). A row that is no longer live keeps no vector.
CREATE TABLE IF NOT EXISTS saved_vectors {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    thread_id String,
    msg_id String,
    live Bool,
    model LowCardinality(String),
    vector Array(BFloat16) CODEC(NONE),         -- half the bytes to scan; ranking-grade precision
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, user_id, thread_id, msg_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS saved_vectors_mv {on_cluster} TO saved_vectors AS
SELECT namespace, user_id, thread_id, msg_id,
       is_saved AND NOT tombstoned AND error = '' AND length(embedding) > 0 AS live,
       model, arrayMap(x -> toBFloat16(x), arrayFilter(x -> live, embedding)) AS vector, version
FROM conversation_embeddings
WHERE user_id != '' AND (is_saved OR saved_at IS NOT NULL);

-- Rows saved before this migration (the views see only later inserts). A second
-- runner doing the same inserts identical rows, which the engines collapse.
INSERT INTO saved_feed
SELECT namespace, user_id, thread_id, msg_id, agent, role, ts, saved_at, is_saved, tombstoned, high_sensitivity,
       content, version
FROM conversations
WHERE user_id != '' AND (is_saved OR saved_at IS NOT NULL);

INSERT INTO saved_vectors
SELECT namespace, user_id, thread_id, msg_id,
       is_saved AND NOT tombstoned AND error = '' AND length(embedding) > 0 AS live,
       model, arrayMap(x -> toBFloat16(x), arrayFilter(x -> live, embedding)) AS vector, version
FROM conversation_embeddings
WHERE user_id != '' AND (is_saved OR saved_at IS NOT NULL);
