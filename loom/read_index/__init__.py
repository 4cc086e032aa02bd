"""The read index: conversation.search's vectors held in memory by one process.

ClickHouse stays the record of every row. The index is a copy, fed by the write path
(:mod:`loom.read_index.feed`: every embedding-row insert and every search-mark raise
publishes an event on a Redis stream) and rebuilt from ClickHouse when it starts or
finds a gap in the stream (:mod:`loom.read_index.state`). The process that holds it
(:mod:`loom.read_index.server`, supervised by `loom serve`) answers candidates over a
unix socket (:mod:`loom.read_index.client`); conversation.search verifies what the
index cannot vouch for against the engine, and reads the engine alone, saying so, when
the index is away or does not hold a namespace. docs/architecture.md draws the path.
"""
