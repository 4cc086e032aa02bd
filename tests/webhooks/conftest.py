"""Fixtures of the webhook tests: the worker's settings (short backoffs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def worker_settings(arq_worker: Any) -> Iterator[Any]:
    """set(**changes): the worker's settings for this test (short backoffs by default)."""
    worker = arq_worker.ctx["loom"]
    before = worker.settings

    def _set(**changes: Any) -> None:
        worker.settings = before.model_copy(update=changes)

    _set(webhook_backoff_seconds=0.2, webhook_max_attempts=5, webhook_timeout_seconds=2.0)
    yield _set
    worker.settings = before
