"""Import and export: a history brought in from the chat apps people use (and Loom's own
export), and a namespace, user or thread taken out in one documented format.

- :mod:`importing`: import.start / import.write / import.status (admin). A client (the
  `loom import` CLI) reads the file, sends its records in numbered batches; each batch
  is committed whole before the job's position moves, so an import resumes from its
  last committed batch. Turns go through conversation.append's own write path
  (:mod:`loom.ops.conversation.writing.appending`), so the recording switch, the duplicate
  check and the sensitivity screen hold exactly as for an append; their embeddings are
  left to the background (:mod:`embedding`).
- :mod:`records`: how each kind of record is written (turns through the append path;
  threads, briefs, memory and the rest only where the namespace holds no such row yet).
- :mod:`embedding`: the worker's pass over an import's turns, at the model's rate.
- :mod:`windows`: which turns are an import's to embed (the recovery pass leaves them).
- :mod:`exporting`: export.start (admin), the streamed, compressed, checksummed export.
"""
