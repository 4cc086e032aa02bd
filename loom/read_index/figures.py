"""The read index's figures for an API process: its state, memory, lag and hit rate, as
health.show answers them and /metrics exports them (asked of the index process itself,
which keeps them: loom.read_index.server.IndexServer.stats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from loom.read_index import client as index_client

FALLBACKS = Counter(
    "loom_read_index_fallbacks_total",
    "Searches (or parts of them) the engine answered instead of the read index, by fallback_reason.",
    ["reason"],
)
_GAUGES = {
    name: Gauge(f"loom_read_index_{name}", doc)
    for name, doc in {
        "up": "1 while the read index answers this API process, 0 when it does not (or none is configured).",
        "bytes": "Memory the read index holds (vectors, texts, rows).",
        "budget_bytes": "LOOM_READ_INDEX_MB, in bytes.",
        "rows": "Vectors the read index holds.",
        "namespaces": "Namespaces the read index holds.",
        "loading": "Namespaces being read from ClickHouse or waiting for it.",
        "lag_p50_ms": "Median time from a write event's publication to its application (last 10k events).",
        "lag_p99_ms": "99th percentile of the same.",
        "events": "Write events applied since the index process started.",
        "searches": "Searches the index process answered since it started.",
        "served": "Namespaces of those searches it held (hits).",
        "missed": "Namespaces of those searches it did not hold, left to the engine (misses).",
        "last_load_seconds": "How long the last namespace load from ClickHouse took.",
        "gaps": "Gaps in the event stream that made it load everything again.",
    }.items()
}


@dataclass(frozen=True)
class Figures:
    state: str  # "ok", "off" (none configured) or "down"
    bytes: int = 0
    budget_bytes: int = 0
    rows: int = 0
    namespaces: int = 0
    loading: int = 0
    lag_p50_ms: float = 0.0
    lag_p99_ms: float = 0.0
    searches: int = 0
    served: int = 0
    missed: int = 0
    hit_rate: float | None = None  # served / (served + missed); None before any search


async def read(svc: Any) -> Figures:
    client = index_client.of(svc)
    if client is None:
        return Figures("off")
    stats = await client.call({"op": "stats"})
    if stats is None or stats.get("status") != "ok":
        return Figures("down")
    fields = {
        k: stats[k] for k in Figures.__dataclass_fields__ if k not in ("state", "hit_rate") and k in stats
    }
    asked = int(stats["served"]) + int(stats["missed"])
    return Figures("ok", **fields, hit_rate=round(int(stats["served"]) / asked, 4) if asked else None)


async def refresh_metrics(svc: Any) -> None:
    """Set the gauges from the index (before /metrics is rendered)."""
    client = index_client.of(svc)
    stats = await client.call({"op": "stats"}) if client is not None else None
    up = stats is not None and stats.get("status") == "ok"
    _GAUGES["up"].set(1 if up else 0)
    if not up or stats is None:
        return
    for name, gauge in _GAUGES.items():
        key = "last_load_s" if name == "last_load_seconds" else name
        if key in stats:
            gauge.set(float(stats[key]))
