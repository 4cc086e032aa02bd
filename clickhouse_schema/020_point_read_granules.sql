-- loom: writers-must-upgrade
-- Smaller granules for the two tables read by key on every hot path (issue 25).
--
-- An append's duplicate check, save_message's reads and claim, and search's
-- verification read a few rows of loom.conversations and loom.conversation_embeddings
-- by key (mostly with FINAL), and ClickHouse reads whole granules: 8,192 rows (the
-- default) of text, and of vectors, per key. At 256 rows a point read costs the engine
-- a fraction of the CPU (bench/results/2026-12-03-granularity.txt), for a primary
-- index 32 times larger in memory (still small: a few bytes per row's key) and no
-- measurable change to an append flush's insert.
--
-- index_granularity cannot be changed on a table (ClickHouse refuses it, Code 472), so
-- each table is rebuilt: a copy (`CREATE TABLE ... AS` takes the columns and skip
-- indexes from the table; the engine, key and settings are those of 001 and 005, with
-- smaller granules; a cluster gets a Replicated engine of its own path, as every
-- table does), every row copied (every version, tombstones included), then the two
-- swapped atomically (EXCHANGE TABLES, Atomic databases) and the old one dropped. The
-- materialized views that read these tables name them, so they follow the swap. The
-- retention TTL of loom.conversations is set again right after the migrations, at
-- every start (clickhouse_schema/runner.py, apply_storage_rules). A storage policy set
-- on loom.conversations by hand (README, tiering) is not carried over: set it again.
--
-- `{run}` is unique to this run (the runner fills it): two processes migrating at
-- once each swap in their own copy, both with small granules, and each copies into
-- the table then named conversations the rows its swapped-out table holds and that one
-- lacks (rows an insert wrote to the old table after it was copied), before dropping it.
--
-- Writers must upgrade first: a delete (an unsave's, an erasure's) that an older
-- replica ran on the old table after its rows were copied would not reach the copy.

CREATE TABLE IF NOT EXISTS conversations_020_{run} {on_cluster} AS conversations
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, agent, thread_id, msg_id)
SETTINGS index_granularity = 256, non_replicated_deduplication_window = 10000, merge_selector_base = 10;

INSERT INTO conversations_020_{run} SELECT * FROM conversations;

EXCHANGE TABLES conversations AND conversations_020_{run} {on_cluster};

INSERT INTO conversations SELECT * FROM conversations_020_{run}
WHERE (cityHash64(namespace, agent, thread_id, msg_id), version) NOT IN
      (SELECT cityHash64(namespace, agent, thread_id, msg_id), version FROM conversations);

DROP TABLE IF EXISTS conversations_020_{run} {on_cluster} SYNC;

CREATE TABLE IF NOT EXISTS conversation_embeddings_020_{run} {on_cluster} AS conversation_embeddings
ENGINE = ReplacingMergeTree(version)
ORDER BY (namespace, thread_id, msg_id)
SETTINGS index_granularity = 256, non_replicated_deduplication_window = 10000, merge_selector_base = 10;

INSERT INTO conversation_embeddings_020_{run} SELECT * FROM conversation_embeddings;

EXCHANGE TABLES conversation_embeddings AND conversation_embeddings_020_{run} {on_cluster};

INSERT INTO conversation_embeddings SELECT * FROM conversation_embeddings_020_{run}
WHERE (cityHash64(namespace, thread_id, msg_id), version) NOT IN
      (SELECT cityHash64(namespace, thread_id, msg_id), version FROM conversation_embeddings);

DROP TABLE IF EXISTS conversation_embeddings_020_{run} {on_cluster} SYNC;
