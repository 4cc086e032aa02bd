-- Live settings: an admin's override of a setting the environment gives (settings.set,
-- the dashboard). One row per change; the newest row of a name wins (ReplacingMergeTree
-- on version, a nanosecond clock), and an override removed is a row with cleared = 1.
-- value is the JSON text of the setting's value. Every API and worker process re-reads
-- the table when the settings version in Redis changes (loom.ops.settings).
CREATE TABLE IF NOT EXISTS settings_overrides {on_cluster}
(
    name LowCardinality(String),                -- the field name (conversation_search_excerpt_chars)
    value String,                               -- JSON
    cleared Bool,
    updated_at DateTime64(3, 'UTC'),
    updated_by String,                          -- the token id that changed it
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY name;
