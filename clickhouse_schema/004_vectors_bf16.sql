-- The vector tables of conversation.search keep their copy of each vector as BFloat16.
--
-- They are indexes (migration 002): the truth stays Float32 in conversation_embeddings.
-- The HNSW graph already ranks on bf16 copies ('bf16' quantization), and ClickHouse
-- answers an index search's distance from the graph, so a Float32 column here bought
-- no precision the index kept, at 768 extra bytes per 384-dim vector (a fifth of
-- everything Loom stored per turn at 1M turns: bench/results/2026-12-01-full-1m.json).
-- It also makes the exact scan and the index report the same similarity for a row. The materialized views keep selecting
-- Float32 from conversation_embeddings; the insert into these tables casts.
--
-- MODIFY COLUMN rewrites the column in every part and rebuilds the HNSW index of the
-- parts it rewrites; running it again on a BFloat16 column changes nothing.

ALTER TABLE conversation_vectors_384 {on_cluster} MODIFY COLUMN embedding Array(BFloat16) CODEC(NONE);

ALTER TABLE conversation_vectors_1536 {on_cluster} MODIFY COLUMN embedding Array(BFloat16) CODEC(NONE);
