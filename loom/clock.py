"""Version stamps for ReplacingMergeTree rows and UTC timestamps."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

_lock = threading.Lock()
_last = 0


def next_version() -> int:
    """A strictly increasing nanosecond clock: a later write always wins the merge."""
    global _last
    with _lock:
        now = time.time_ns()
        _last = now if now > _last else _last + 1
        return _last


def utcnow() -> datetime:
    return datetime.now(UTC)
