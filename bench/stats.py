"""Small statistics shared by the harness and the targets."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def percentiles(samples: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """p50/p95/p99/mean/max of ``samples`` (seconds), scaled (default: to milliseconds)."""
    if not samples:
        return {"n": 0}
    a = np.asarray(samples, dtype=np.float64) * scale
    return {
        "n": int(a.size),
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
        "max": float(a.max()),
    }


def recall_at_k(hits: Sequence[Sequence[str]], truth: Sequence[Sequence[str]], k: int = 10) -> float:
    """Mean |hits ∩ truth| / |truth| over queries with a non-empty truth (both cut at k)."""
    vals = []
    for h, t in zip(hits, truth, strict=True):
        tt = set(t[:k])
        if tt:
            vals.append(len(set(h[:k]) & tt) / len(tt))
    return float(np.mean(vals)) if vals else 1.0


def hit_at_k(hits: Sequence[Sequence[str]], sources: Sequence[str], k: int = 10) -> float:
    """Share of queries whose source message is among the first ``k`` hits."""
    if not sources:
        return 0.0
    return sum(1 for h, s in zip(hits, sources, strict=True) if s in h[:k]) / len(sources)


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of the processes (clock ticks from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
