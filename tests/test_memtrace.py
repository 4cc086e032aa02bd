"""loom.memtrace: off unless LOOM_MEMTRACE_DIR is set; then it writes what grew."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from loom import memtrace
from loom.settings import Settings


def test_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    memtrace.start(Settings(memtrace_dir=""), "api")
    assert not tracemalloc.is_tracing()


def test_writes_what_grew(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc already on in this process")
    kept: list[bytes] = []
    try:
        memtrace.start(Settings(memtrace_dir=str(tmp_path), memtrace_every_s=0.2), "worker")
        assert tracemalloc.is_tracing()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            kept.append(b"x" * 10_000)  # grows after the first snapshot
            files = list(tmp_path.glob("worker-*.txt"))
            if files and "test_memtrace.py" in files[0].read_text():
                break
            time.sleep(0.05)
        [dump] = list(tmp_path.glob("worker-*.txt"))
        text = dump.read_text()
        assert "traced" in text and "since the first" in text and "test_memtrace.py" in text
    finally:
        tracemalloc.stop()
