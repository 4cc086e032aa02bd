-- conversation.redact and conversation.delete_message: one row per removal of one turn
-- (or of spans of it), so erasure.export can show that a turn was redacted or removed,
-- when and by which token, and with which placeholder. It holds no text of the turn:
-- only its key, the owner the turn had, the placeholder and how many spans went.
CREATE TABLE IF NOT EXISTS message_redactions {on_cluster}
(
    namespace LowCardinality(String),
    agent LowCardinality(String),
    thread_id String,
    msg_id String,
    user_id String,                             -- the turn's owner ('' = none): what export selects by
    action LowCardinality(String),              -- redacted | deleted
    placeholder String,                         -- what replaced each span ('' for a deletion)
    spans UInt32,                               -- how many spans were replaced (0 for a deletion)
    token_id String,                            -- the token that asked
    redacted_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (namespace, user_id, thread_id, msg_id, redacted_at);
