-- conversation.search's lexical leg: BM25 postings of the transcript, kept by ClickHouse
-- itself. A materialized view writes, for every insert into loom.conversations, the
-- postings of each live recorded turn search covers (user and assistant turns,
-- compaction summaries), so every writer (append, ingest, compaction, redaction, a
-- recompaction's restored turns, a bulk loader) keeps the index current without knowing
-- it exists. It is an index, never the truth: a tombstone, a redaction's old text or a
-- retention TTL does not pass through the view, so every candidate is checked against
-- the newest transcript row (live, recorded, not high, and still the very text the
-- posting was written from) before it is answered (loom/store/transcript_terms.py).
--
-- What enters: never a turn marked high (no term of a high turn is stored), never a
-- saved-only row (origin 'saved': it belongs to the user who saved it), never a
-- tombstoned version. Terms: the tokeniser of loom.store.bm25.TERMS (as 003_saved.sql),
-- then its light English stemmer (loom.store.bm25.stems_sql; a test checks the
-- expression below is the same, character for character).
--
-- One row per (namespace, term, document): a document is one agent's copy of a turn
-- with its text (doc = cityHash64(thread_id, msg_id, agent, content), as the saved
-- index names them). Each posting carries what the query filters on and what a hit
-- shows (agent, thread, message, role, run, owner, time) and the document's length, so
-- a query reads its terms' postings and nothing else. Every document also gets a
-- posting of the empty term (no real term is empty): those give BM25 its corpus
-- statistics, the number of documents and their average length, per namespace, and
-- the text's first 2,048 characters (`head`, as an embedding row keeps them), from
-- which a hit's excerpt is cut: a page of hits then reads a few small granules of this
-- table rather than one 8,192-row granule of loom.conversations' text per hit
-- (measured: 58 ms of engine CPU for 23 hits at 100k turns, most of a search).
-- ReplacingMergeTree(version): a revision that leaves the text as it was (a save, a
-- change of owner) rewrites the same postings with its version; the newest wins.
-- ts is the turn's time: the table carries the transcript's retention TTL
-- (clickhouse_schema.runner.DERIVED_TEXT_TABLES).

CREATE TABLE IF NOT EXISTS conversation_terms {on_cluster}
(
    namespace LowCardinality(String),
    term String,
    doc UInt64,
    tf UInt32,                                  -- occurrences of the term in the text (1 for '')
    doc_len UInt32,                             -- terms in the whole text (BM25's document length)
    agent LowCardinality(String),
    thread_id String,
    msg_id String,
    role LowCardinality(String),
    run_id String,
    user_id String,
    ts DateTime64(6, 'UTC'),
    head String CODEC(ZSTD(3)),                 -- '' term only: the text's first 2,048 characters (a hit's excerpt)
    version UInt64                              -- the transcript row version it was written from
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, term, doc)
SETTINGS index_granularity = 128;

-- The postings are built without a GROUP BY (each text's terms counted by sumMap), and
-- the text's head travels inside the array joined, in its first element only, so the
-- other postings do not copy it.
CREATE MATERIALIZED VIEW IF NOT EXISTS conversation_terms_mv {on_cluster} TO conversation_terms AS
SELECT namespace, posting.1 AS term, doc, posting.2 AS tf, dl AS doc_len, agent, thread_id, msg_id, role, run_id,
       user_id, ts, posting.3 AS head, version
FROM (
    SELECT namespace, agent, thread_id, msg_id, role, run_id, user_id, ts, version,
           cityHash64(thread_id, msg_id, agent, content) AS doc,
           arrayMap(t -> multiIf(length(t) <= 5 OR NOT match(t, '^[a-z]+$'), t, endsWith(t, 'ing') AND length(t) >= 7, if(match(substring(t, 1, length(t) - 3), '(bb|dd|gg|mm|nn|pp|rr|tt)$'), substring(t, 1, length(t) - 4), substring(t, 1, length(t) - 3)), endsWith(t, 'ed'), if(match(substring(t, 1, length(t) - 2), '(bb|dd|gg|mm|nn|pp|rr|tt)$'), substring(t, 1, length(t) - 3), substring(t, 1, length(t) - 2)), t), arrayMap(t -> multiIf(length(t) <= 3 OR NOT match(t, '^[a-z]+$'), t, endsWith(t, 'sses') OR match(t, '(x|ch|sh|zz)es$'), substring(t, 1, length(t) - 2), endsWith(t, 'ies') AND NOT match(t, '[ae]ies$'), concat(substring(t, 1, length(t) - 3), 'y'), match(t, '[^aeo]es$'), substring(t, 1, length(t) - 1), endsWith(t, 's') AND NOT match(t, '(us|ss)$'), substring(t, 1, length(t) - 1), t), arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))))) AS terms,
           toUInt32(length(terms)) AS dl,
           arrayReduce('sumMap', [terms], [arrayMap(t -> toUInt32(1), terms)]) AS counted,
           arrayConcat([('', toUInt32(1), leftUTF8(content, 2048))],
                        arrayMap((t, n) -> (t, n, ''), counted.1, counted.2)) AS postings
    FROM conversations
    WHERE NOT tombstoned AND NOT high_sensitivity AND origin = 'recorded'
      AND (role IN ('user', 'assistant') OR is_summary)
)
ARRAY JOIN postings AS posting;

-- Turns recorded before this migration (the view sees only later inserts). A second
-- runner doing the same inserts identical rows, which the engine collapses.
INSERT INTO conversation_terms (namespace, term, doc, tf, doc_len, agent, thread_id, msg_id, role, run_id, user_id, ts,
                                head, version)
SELECT namespace, posting.1 AS term, doc, posting.2 AS tf, dl AS doc_len, agent, thread_id, msg_id, role, run_id,
       user_id, ts, posting.3 AS head, version
FROM (
    SELECT namespace, agent, thread_id, msg_id, role, run_id, user_id, ts, version,
           cityHash64(thread_id, msg_id, agent, content) AS doc,
           arrayMap(t -> multiIf(length(t) <= 5 OR NOT match(t, '^[a-z]+$'), t, endsWith(t, 'ing') AND length(t) >= 7, if(match(substring(t, 1, length(t) - 3), '(bb|dd|gg|mm|nn|pp|rr|tt)$'), substring(t, 1, length(t) - 4), substring(t, 1, length(t) - 3)), endsWith(t, 'ed'), if(match(substring(t, 1, length(t) - 2), '(bb|dd|gg|mm|nn|pp|rr|tt)$'), substring(t, 1, length(t) - 3), substring(t, 1, length(t) - 2)), t), arrayMap(t -> multiIf(length(t) <= 3 OR NOT match(t, '^[a-z]+$'), t, endsWith(t, 'sses') OR match(t, '(x|ch|sh|zz)es$'), substring(t, 1, length(t) - 2), endsWith(t, 'ies') AND NOT match(t, '[ae]ies$'), concat(substring(t, 1, length(t) - 3), 'y'), match(t, '[^aeo]es$'), substring(t, 1, length(t) - 1), endsWith(t, 's') AND NOT match(t, '(us|ss)$'), substring(t, 1, length(t) - 1), t), arrayFilter(t -> length(t) <= 64, arrayConcat(extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+'), extractAll(translateUTF8(lowerUTF8(content), '“”‘’«»—–…•·', '           '), '[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+(?:[-_./:@#][^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+)+'))))) AS terms,
           toUInt32(length(terms)) AS dl,
           arrayReduce('sumMap', [terms], [arrayMap(t -> toUInt32(1), terms)]) AS counted,
           arrayConcat([('', toUInt32(1), leftUTF8(content, 2048))],
                        arrayMap((t, n) -> (t, n, ''), counted.1, counted.2)) AS postings
    FROM conversations FINAL
    WHERE NOT tombstoned AND NOT high_sensitivity AND origin = 'recorded'
      AND (role IN ('user', 'assistant') OR is_summary)
)
ARRAY JOIN postings AS posting;
