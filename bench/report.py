"""The results table (medians, p95/p99 and the Loom / baseline ratio per figure) and the JSON file."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# (result key, figure label, [(stat path, stat label, unit)])
FIGURES: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    (
        "append_plain",
        "append, no embedding",
        [
            ("per_second", "throughput", "turns/s"),
            ("latency_ms.p50", "p50", "ms"),
            ("latency_ms.p95", "p95", "ms"),
            ("latency_ms.p99", "p99", "ms"),
        ],
    ),
    (
        "append_embedded",
        "append, embedded turns",
        [
            ("per_second", "throughput", "turns/s"),
            ("latency_ms.p50", "p50", "ms"),
            ("latency_ms.p95", "p95", "ms"),
            ("latency_ms.p99", "p99", "ms"),
        ],
    ),
    (
        "search",
        "vector search",
        [
            ("latency_ms.p50", "p50", "ms"),
            ("latency_ms.p95", "p95", "ms"),
            ("latency_ms.p99", "p99", "ms"),
            ("per_second", "throughput", "q/s"),
            ("solo_latency_ms.p50", "p50, 1 client", "ms"),
            ("solo_latency_ms.p95", "p95, 1 client", "ms"),
            ("recall_at_10", "recall@10", ""),
        ],
    ),
    (
        "saved_search",
        "saved hybrid search",
        [
            ("latency_ms.p50", "p50", "ms"),
            ("latency_ms.p95", "p95", "ms"),
            ("latency_ms.p99", "p99", "ms"),
            ("per_second", "throughput", "q/s"),
            ("solo_latency_ms.p50", "p50, 1 client", "ms"),
            ("solo_latency_ms.p95", "p95, 1 client", "ms"),
            ("hit_at_10", "hit@10", ""),
        ],
    ),
    ("bytes", "bytes on disk per turn", [("per_turn", "total", "B/turn")]),
    ("erase", "erase one user", [("seconds", "median", "ms")]),
    ("index_build", "index build after load", [("seconds", "time", "s")]),
]
SIDES = ("loom", "baseline")


def _get(d: Any, path: str) -> float | None:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return float(d) if isinstance(d, int | float) else None


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "":
        return f"{v:.3f}"
    if unit in ("ms",):
        return f"{v:.2f}" if v < 10 else f"{v:.1f}"
    if unit == "s":
        return f"{v:.2f}"
    return f"{v:,.0f}"


def _notes(key: str, side: dict[str, Any], doc: dict[str, Any]) -> str:
    fig = side.get(key) or {}
    if key == "append_embedded" and doc.get("model_rate"):
        return f"model alone: {doc['model_rate']['texts_per_second']:.0f} texts/s"
    if key == "append_plain" and "duplicates_sent" in fig:
        return f"dups caught {fig.get('duplicates_detected')}/{fig.get('duplicates_sent')}"
    if key == "search":
        tuning = side.get("tuning") or {}
        if "ef_search" in tuning:
            return f"ef_search={tuning['ef_search']} (target recall {tuning.get('target_recall')})"
    if key == "saved_search" and "saved_per_user" in fig:
        return f"{fig['saved_per_user']:,} saved/user"
    if key == "bytes" and "payload_per_turn" in fig:
        return f"text+vector payload {fig['payload_per_turn']:.0f} B/turn"
    if key == "erase" and "rows" in fig:
        return f"rows {fig['rows']} of {fig.get('namespace_turns', 0):,}"
    return ""


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (scale, figure, stat): values per side, the ratio Loom / baseline, notes."""
    out: list[dict[str, Any]] = []
    res = doc.get("results", {})
    status = doc.get("targets", {})
    scales = sorted({int(s) for side in res.values() for s in side}, key=int)
    for scale in scales:
        for key, label, stats in FIGURES:
            for path, stat, unit in stats:
                row: dict[str, Any] = {
                    "scale": scale,
                    "figure": key,
                    "label": label,
                    "stat": stat,
                    "unit": unit,
                }
                notes = []
                for name in SIDES:
                    side = res.get(name, {}).get(str(scale))
                    if side is None:
                        st = status.get(name, {})
                        row[name] = None
                        row[f"{name}_text"] = (
                            "not wired"
                            if st.get("wired") is False
                            else "failed"
                            if st.get("failed")
                            else "not run"
                        )
                        continue
                    fig = side.get(key) or {}
                    v = _get(fig, path)
                    if key == "erase" and v is not None:
                        v *= 1000.0
                    row[name] = v
                    row[f"{name}_text"] = (
                        _fmt(v, unit)
                        if v is not None
                        else "not wired"
                        if fig.get("skipped")
                        else "error"
                        if fig.get("error")
                        else "—"
                    )
                    if stat in ("throughput", "p50", "total", "median", "time", "hit@10"):
                        n = _notes(key, side, doc)
                        if n:
                            notes.append(f"{name}: {n}")
                lv, bv = row.get("loom"), row.get("baseline")
                row["ratio"] = (lv / bv) if (lv is not None and bv) else None
                row["notes"] = (
                    "; ".join(dict.fromkeys(notes))
                    if stat in ("throughput", "p50", "total", "median", "time", "hit@10")
                    else ""
                )
                out.append(row)
    return out


def _scale_name(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def print_table(doc: dict[str, Any]) -> None:
    table_rows = rows(doc)
    header = ["scale", "figure", "stat", "unit", "Loom", "baseline", "Loom/base", "notes"]
    body = [
        [
            _scale_name(r["scale"]),
            r["label"],
            r["stat"],
            r["unit"],
            r["loom_text"],
            r["baseline_text"],
            f"{r['ratio']:.2f}x" if r["ratio"] is not None else "—",
            r["notes"],
        ]
        for r in table_rows
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
        for line in [header, *body]:
            print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)))
    else:
        t = Table(
            title=f"Loom vs Postgres + pgvector ({doc['meta']['mode']} mode, "
            f"{doc['meta']['machine']['nproc']} cores, {doc['meta']['machine']['memory_gib']} GiB)"
        )
        for h in header:
            t.add_column(
                h, justify="right" if h in ("Loom", "baseline", "Loom/base") else "left", overflow="fold"
            )
        last = None
        for line in body:
            if last is not None and line[1] != last:
                t.add_section()
            last = line[1]
            t.add_row(*line)
        Console(width=180).print(t)
    for name, st in doc.get("targets", {}).items():
        if st.get("wired") is False:
            print(f"{name}: {st.get('note', 'not wired')}")
        elif st.get("failed"):
            print(f"{name}: failed to start: {st['failed']}")
    base = doc.get("targets", {}).get("baseline", {}).get("facts", {})
    if base.get("postgres"):
        print(
            f"baseline: PostgreSQL {base['postgres']} + pgvector {base.get('pgvector')} ({base.get('binaries')}), "
            f"HNSW m={base['hnsw']['m']} ef_construction={base['hnsw']['ef_construction']}, "
            f"iterative_scan={base['hnsw'].get('iterative_scan')}"
        )


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    path = out_dir / f"{date}-{doc['meta']['mode']}.json"
    n = 2
    while path.exists():
        path = out_dir / f"{date}-{doc['meta']['mode']}-{n}.json"
        n += 1
    doc = dict(doc, table=rows(doc))
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def checkout_rev(repo: Path) -> str:
    """This checkout's commit, short, marked as the working tree (a run measures it as it is)."""
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    return f"{rev.stdout.strip()} (working tree)"


def save_run(out_dir: Path, stem: str, result: dict[str, Any], text: str) -> None:
    """Print a run's table and keep the run as ``<out_dir>/<stem>.{json,txt}``."""
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / f"{stem}.txt").write_text(text + "\n")
    print(f"written: {out_dir / stem}.{{json,txt}}")
