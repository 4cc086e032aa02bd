"""The benchmark harness end to end: ``python -m bench --smoke`` runs both targets (Loom
as ``loom serve`` starts it, and the Postgres + pgvector baseline) through every figure at
a tiny scale. The harness must not rot: a figure without a Loom or a baseline value, or
with an error, fails here, as does a run that hangs (Loom's settle waiting for something
the run did not load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.report import FIGURES, SIDES

REPO = Path(__file__).resolve().parents[2]
RUN_LIMIT_S = 240  # the run takes about a minute on two idle cores

pytestmark = pytest.mark.timeout(RUN_LIMIT_S + 30)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench-results")
    # The wheel's PostgreSQL (bench extra): never apt-get from a test.
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--pg", "wheel", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(out.glob("*-smoke.json"))
    assert len(files) == 1, (files, proc.stdout[-2000:])
    doc: dict[str, Any] = json.loads(files[0].read_text())
    doc["_log"] = proc.stdout
    return doc


def test_both_targets_started(smoke_run: dict[str, Any]) -> None:
    for side in SIDES:
        status = smoke_run["targets"][side]
        assert status.get("wired") is True and not status.get("failed"), (side, status)


def test_every_figure_has_a_value_on_both_sides(smoke_run: dict[str, Any]) -> None:
    table = smoke_run["table"]
    assert {r["figure"] for r in table} == {key for key, _label, _stats in FIGURES}
    missing = [
        (r["figure"], r["stat"], side, r[f"{side}_text"]) for r in table for side in SIDES if r[side] is None
    ]
    assert not missing, (missing, smoke_run["_log"][-3000:])


def test_no_figure_carries_an_error(smoke_run: dict[str, Any]) -> None:
    for side in SIDES:
        for scale, figures in smoke_run["results"][side].items():
            for name, fig in figures.items():
                if isinstance(fig, dict):
                    assert "error" not in fig and "skipped" not in fig, (side, scale, name, fig)
                    assert not fig.get("errors"), (side, scale, name, fig.get("first_error"))


def test_loom_settles_on_the_turns_it_was_given(smoke_run: dict[str, Any]) -> None:
    """Every embedded append stored; settle returned once their vectors were written (not
    after a timeout), though Loom's scheduled jobs kept arq busy throughout."""
    for figures in smoke_run["results"]["loom"].values():
        emb = figures["append_embedded"]
        assert emb["stored"] == emb["done"] - emb["duplicates_detected"] > 0
        assert emb["settle_seconds"] < 60
    facts = smoke_run["targets"]["loom"]["facts"]
    assert facts["settle_embedding_errors"] == 0
