"""The memory plane: facts (memory.set, memory.search, memory.list, memory.delete),
extraction from messages (memory.set_from_messages) and reads over its evidence
(memory.recall). See docs/memory.md."""
