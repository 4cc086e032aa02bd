"""What every job gets in its ctx: the worker process's services (ctx["loom"]), its
embedding pipeline and model batcher (made at start-up), and what arq adds per job."""

from __future__ import annotations

import contextlib
from typing import TypedDict

from loom.ops.embedding.writer import EmbedPipeline
from loom.providers.embedders.batcher import ModelBatcher
from loom.services import Services

# arq hands each job a copy of the dict its start-up filled, with the job's own keys.
WorkerContext = TypedDict(
    "WorkerContext",
    {
        "loom": Services,
        "process": contextlib.AsyncExitStack,  # the process's life (loom.lifecycle.running)
        "conversation.embed_pipeline": EmbedPipeline,
        "conversation.model_batcher": ModelBatcher,
        "job_id": str,
        "job_try": int,
    },
    total=False,
)


def services(ctx: WorkerContext) -> Services:
    return ctx["loom"]
