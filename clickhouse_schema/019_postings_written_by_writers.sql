-- The transcript's postings (conversation_terms, migration 016) are written by the
-- transcript's writers from now on, tokenised in Python before each insert
-- (loom.store.transcript_postings), rather than by a materialized view running the
-- tokeniser and stemmer as SQL expressions inside every insert: the view tripled the
-- cost of an append flush's insert. The table and its rows stay as they are.
DROP VIEW IF EXISTS conversation_terms_mv {on_cluster};
