-- Merge the tables every append flush writes to with less rewriting.
--
-- Each flush inserts one part per table, and ClickHouse's merge selector (base 5, lower
-- still for small parts) kept merging a table's one big part with each new small part:
-- in the tool-append benchmark (32 clients, ~40 inserts/s, a 15k-row conversations
-- table) the engine rewrote 605 MB in 10 s to insert 2.7 MB, half of its CPU. On the
-- vector tables every such merge also rebuilds the HNSW graph of the merged part.
-- Measured on chdb with that insert pattern (28-row parts, 15 s): base 5 merged 197 MB
-- and kept 5 parts, base 10 merged 26 MB and kept 8, base 20 merged 13 MB but kept 15
-- (each part is one more range for every read); min_parts_to_merge_at_once = 8 made it
-- worse (907 MB).

ALTER TABLE conversations {on_cluster} MODIFY SETTING merge_selector_base = 10;

ALTER TABLE conversation_embeddings {on_cluster} MODIFY SETTING merge_selector_base = 10;

ALTER TABLE threads {on_cluster} MODIFY SETTING merge_selector_base = 10;

ALTER TABLE conversation_vectors_384 {on_cluster} MODIFY SETTING merge_selector_base = 10;

ALTER TABLE conversation_vectors_1536 {on_cluster} MODIFY SETTING merge_selector_base = 10;
