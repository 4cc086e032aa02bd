"""bench/results/INDEX.md and the figures of record quoted in README.md and
docs/performance.md are current (``python -m bench.index --check``), superseded results
are in the archive, and every result file the repository names exists."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import index

REPO = Path(__file__).resolve().parents[2]


def test_the_index_and_the_quoted_figures_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    status = index.main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_every_named_result_file_exists() -> None:
    named = re.compile(r"bench/results/((?:archive/)?\d{4}-\d{2}-\d{2}[\w.-]*\.(?:txt|json|md))")
    texts = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), REPO / "bench" / "README.md"]
    texts += [*(REPO / "loom").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    missing = [
        (str(path.relative_to(REPO)), name)
        for path in texts
        for name in named.findall(path.read_text())
        if not (index.RESULTS / name).is_file()
    ]
    assert not missing


def _harness_doc(started: str, search_p50_s: float) -> dict[str, object]:
    search = {"latency_ms": {"p50": search_p50_s * 1000}}
    return {
        "meta": {
            "mode": "quick",
            "started": started,
            "argv": ["--quick"],
            "machine": {"loom_commit": "abc1234"},
        },
        "targets": {"loom": {"wired": True}, "baseline": {"wired": True}},
        "results": {"loom": {"10000": {"search": search}}, "baseline": {"10000": {"search": search}}},
    }


@pytest.fixture
def results_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The index pointed at a copy of bench/results and of the two quoting documents."""
    results = tmp_path / "bench" / "results"
    shutil.copytree(index.RESULTS, results)
    docs = []
    for doc in index.DOCS:
        copy = tmp_path / doc.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(doc.read_text())
        docs.append(copy)
    monkeypatch.setattr(index, "REPO", tmp_path)
    monkeypatch.setattr(index, "RESULTS", results)
    monkeypatch.setattr(index, "ARCHIVE", results / "archive")
    monkeypatch.setattr(index, "INDEX", results / "INDEX.md")
    monkeypatch.setattr(index, "DOCS", tuple(docs))
    return results


def test_a_new_run_makes_the_index_stale_until_regenerated(results_copy: Path) -> None:
    (results_copy / "2099-01-01-quick.json").write_text(json.dumps(_harness_doc("2099-01-01T00:00:00", 0.5)))
    assert index.main(["--check"]) == 1
    assert index.main(["--archive"]) == 0
    assert index.main(["--check"]) == 0
    block = index.DOCS[0].read_text()
    assert "| 10k | vector search | p50 | 500 ms | 500 ms | 1.00x | 2099-01-01-quick (abc1234) |" in block
    # The run it superseded for every 10k figure it measured is still the record of the others.
    text = (results_copy / "INDEX.md").read_text()
    assert "2099-01-01-quick.json | 2099-01-01 | abc1234 |" in text


def test_a_superseded_study_result_goes_to_the_archive(results_copy: Path) -> None:
    old = results_copy / "2026-12-03-1506-startup-cold.txt"
    assert old.is_file()
    (results_copy / "2099-01-01-1200-startup.txt").write_text("loom serve to /healthz 200: 1.0 s\n")
    assert index.main(["--archive"]) == 0
    assert not old.exists() and (results_copy / "archive" / old.name).is_file()
    assert index.main(["--check"]) == 0
