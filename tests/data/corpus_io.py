"""What the corpus generators beside this file share: the labelled rows and their file."""

from __future__ import annotations

import json
from pathlib import Path

ROWS: list[dict[str, str]] = []  # one generator runs per process


def hi(kind: str, reason: str, *texts: str) -> None:
    """Texts that must read as high, for `reason` (a loom.sensitivity kind)."""
    ROWS.extend({"kind": kind, "label": "high", "reason": reason, "text": t} for t in texts)


def lo(kind: str, *texts: str) -> None:
    """Look-alikes that must not read as high."""
    ROWS.extend({"kind": kind, "label": "plain", "reason": "", "text": t} for t in texts)


def write_rows(out: Path) -> None:
    """One JSON object a line (UTF-8, not escaped), then a one-line summary on stdout."""
    with out.open("w", encoding="utf-8") as f:
        for row in ROWS:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(ROWS)} rows ({sum(r['label'] == 'high' for r in ROWS)} high) -> {out}")
