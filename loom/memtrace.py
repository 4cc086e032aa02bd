"""Where a long-running process's memory grows: tracemalloc snapshots, for diagnosis only.

Off unless ``LOOM_MEMTRACE_DIR`` is set (a soak sets it: ``bench.studies.soak --env
LOOM_MEMTRACE_DIR=/tmp/mt``). Then, once start-up is done, tracing starts (allocations
made before are not traced: the growth is what matters), and every
``LOOM_MEMTRACE_EVERY_S`` seconds (default 120) a daemon thread appends to
``<dir>/<role>-<pid>.txt`` the allocations that grew most since the first snapshot
(taken one period in), by line and by call stack (``LOOM_MEMTRACE_FRAMES`` frames, default 8). Tracing costs CPU
and memory of its own (about a third more of each): never on in production.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from pathlib import Path

from loom.settings import Settings

TOP_LINES = 25
TOP_STACKS = 10


def start(settings: Settings, role: str) -> None:
    """Start tracing and the dumping thread if LOOM_MEMTRACE_DIR is set (idempotent)."""
    if not settings.memtrace_dir or tracemalloc.is_tracing():
        return
    every = settings.memtrace_every_s
    tracemalloc.start(settings.memtrace_frames)
    path = Path(settings.memtrace_dir) / f"{role}-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=_dump_loop, args=(path, every), name="memtrace", daemon=True).start()


def _snapshot() -> tracemalloc.Snapshot:
    """Allocations, without tracemalloc's own and this module's (its reports read source lines)."""
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<unknown>"),
            tracemalloc.Filter(False, __file__, all_frames=True),
        ]
    )


def _dump_loop(path: Path, every: float) -> None:
    """The first snapshot is taken one period in (what start-up and the first requests
    import lazily is not growth); then each dump is compared with it and with the last."""
    started = time.monotonic()
    time.sleep(every)
    if not tracemalloc.is_tracing():
        return
    first = last = _snapshot()
    while True:
        time.sleep(every)
        if not tracemalloc.is_tracing():  # stopped (a test): so is this thread
            return
        snap = _snapshot()
        current, peak = tracemalloc.get_traced_memory()
        collections = [g["collections"] for g in gc.get_stats()]
        lines = [
            f"== {time.monotonic() - started:.0f} s: traced {current / 1e6:.2f} MB (peak {peak / 1e6:.2f} MB), "
            f"gc collections per generation {collections}, counts {gc.get_count()}, "
            f"since the first: {_total(snap, first) / 1e3:+.1f} kB, since the last: {_total(snap, last) / 1e3:+.1f} kB"
        ]
        lines.append(" -- grown most since the first snapshot, by line")
        lines += [f"  {stat}" for stat in snap.compare_to(first, "lineno")[:TOP_LINES]]
        lines.append(" -- by call stack")
        for stat in snap.compare_to(first, "traceback")[:TOP_STACKS]:
            lines.append(f"  -- {stat.size_diff / 1e3:+.1f} kB, {stat.count_diff:+d} blocks")
            lines += [f"     {line}" for line in stat.traceback.format()]
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")
        last = snap


def _total(snap: tracemalloc.Snapshot, base: tracemalloc.Snapshot) -> int:
    return sum(stat.size_diff for stat in snap.compare_to(base, "filename"))
