-- erasure.request: one row per request, revised as its removal from disk progresses
-- (erasure.status reads it). The receipt (per table: rows tombstoned and removed, a
-- digest of the keys) is what an operator keeps to prove what was erased; it holds no
-- text of the subject.
CREATE TABLE IF NOT EXISTS erasure_requests {on_cluster}
(
    erasure_id String,
    token_id String,                            -- the token that asked
    kind LowCardinality(String),                -- user | namespaces
    user_id String,                             -- the subject of a user erasure ('' otherwise)
    namespaces Array(String),
    purge Bool,
    state LowCardinality(String),               -- removing | done | failed
    receipt String CODEC(ZSTD(3)),              -- JSON
    steps_total UInt32,
    steps_done UInt32,
    error String,
    created_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC') DEFAULT now64(3),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY erasure_id;

-- The keys a request erases, fixed when it is asked: the removal from disk (and a retry
-- of it after a crash) deletes exactly these, whatever happened since. Only identifiers,
-- no text; a request's keys are dropped once its removal is done (its receipt keeps
-- their digest). kind: turn (agent, thread_id, msg_id of loom.conversations), embedding
-- (thread_id, msg_id of loom.conversation_embeddings), handed (an embedding row passed to
-- another user's live copy: it stays).
CREATE TABLE IF NOT EXISTS erasure_keys {on_cluster}
(
    erasure_id String,
    namespace String,
    kind LowCardinality(String),
    agent String,
    thread_id String,
    msg_id String
)
ENGINE = MergeTree
ORDER BY (erasure_id, namespace, kind, thread_id, msg_id, agent);
