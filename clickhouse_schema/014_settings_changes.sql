-- The audit trail of the live settings: who changed which setting, when, from which value
-- to which (settings.set). Append-only; the newest changes are read first. Values are
-- JSON text ('null' where an override was cleared: the environment's value applied).
-- Secrets are never live settings, so none is ever written here.
CREATE TABLE IF NOT EXISTS settings_changes {on_cluster}
(
    changed_at DateTime64(3, 'UTC'),
    name LowCardinality(String),                -- the LOOM_ name
    old_value String,                           -- JSON: the value in force before
    new_value String,                           -- JSON: the value in force after
    changed_by String                           -- the token id
)
ENGINE = MergeTree
ORDER BY changed_at;
