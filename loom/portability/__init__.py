"""Client side of import and export (no server code): source files (files), their
readers (readers) and the export format's JSON Schema (schema). The server's side is
loom.ops.portability; the lines' models are loom.models.portability."""
