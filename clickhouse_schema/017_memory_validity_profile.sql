-- Facts that know time, and a living profile of each user (docs/memory.md).
--
-- Validity and supersession: every fact version says when it became true (valid_from:
-- the newest time of the evidence it came from, a time memory.set was given or stated
-- in the text, else when it was set) and when it stopped (valid_until, NULL while it
-- holds). An update no longer overwrites a fact: it writes a new fact (a new memory_id)
-- that `supersedes` the old one, and the old one keeps its text with valid_until closed
-- and `superseded_by` naming the new one. `lineage` is the id of the first fact of such
-- a chain (a fact that supersedes nothing is its own lineage), so a chain is read (and
-- forgotten, by memory.delete) in one condition. Facts written before this migration
-- read valid_from = created_at, open, their own lineage.
ALTER TABLE memories {on_cluster} ADD COLUMN IF NOT EXISTS valid_from DateTime64(3, 'UTC') DEFAULT created_at;

ALTER TABLE memories {on_cluster} ADD COLUMN IF NOT EXISTS valid_until Nullable(DateTime64(3, 'UTC')) DEFAULT NULL;

ALTER TABLE memories {on_cluster} ADD COLUMN IF NOT EXISTS supersedes String DEFAULT '';

ALTER TABLE memories {on_cluster} ADD COLUMN IF NOT EXISTS superseded_by String DEFAULT '';

ALTER TABLE memories {on_cluster} ADD COLUMN IF NOT EXISTS lineage String DEFAULT memory_id;

-- One profile per user: a short summary in named sections (identity, preferences, work,
-- relationships, other when a model wrote it; the facts' kinds when it was built from
-- the facts alone). A change to the user's facts writes a `stale` version with no text
-- (memory.set, memory.delete); the next read or extraction rebuilds it. The newest
-- version wins; a rebuild's version is stamped before it reads the facts, so a change
-- made while it ran leaves the profile stale.
CREATE TABLE IF NOT EXISTS memory_profiles {on_cluster}
(
    namespace LowCardinality(String),
    user_id String,
    section_names Array(String),
    section_texts Array(String) CODEC(ZSTD(3)),
    basis LowCardinality(String),               -- llm | facts ('' for a stale mark)
    reason String,                              -- why not the model's: llm_not_configured | llm_failed | ''
    fact_ids Array(String),                     -- the current facts it was built from
    dropped UInt32,                             -- sections the model wrote that read as high (not kept)
    stale Bool,
    built_at DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, user_id);
