"""The index of bench/results: ``python -m bench.index [--archive] [--check]``.

Writes bench/results/INDEX.md from the result files themselves (nothing else is read, so
the index of a checkout is always the same): per file its date, the commit it measured
(where the file records it), the command that wrote it and its headline figures; and the
figure of record of every metric:

* a harness metric (scale, figure, statistic of ``python -m bench``): the newest harness
  run (smoke runs aside) that has a Loom value for it;
* a study (bench/studies/, or one deleted once its question was closed): its newest files
  (all of the newest day's when their names carry no time).

A result that is the record of nothing has been superseded: ``--archive`` moves it to
bench/results/archive/. The figures of record are also written between the markers of
README.md's and docs/performance.md's performance sections. ``--check`` writes nothing
and fails when any of that is not current (tests/bench/test_index.py runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import rows as table_rows

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
ARCHIVE = RESULTS / "archive"
INDEX = RESULTS / "INDEX.md"
DOCS = (REPO / "README.md", REPO / "docs" / "performance.md")
BEGIN = "<!-- figures of record: written by `python -m bench.index`, do not edit -->"
END = "<!-- end of figures of record -->"
_STEM = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:-(\d{4}))?-(.+)$")
_OUTSIDE = re.compile(r"/(?:work|tmp|home|root)/\S*/")
_TRACKER = re.compile(r"\b(?:[Ii]ssue|[Ss]ession) \d+\w*(?:'s)?,?:?")
_COMMIT = re.compile(r"\b(?:commit|rev|revision|HEAD)\b[\s:=\"']{1,4}([0-9a-f]{7,40})\b")

# The first pattern matching what follows a file's date names its kind and the command
# that writes it. Deleted studies keep their kind: their last file stays the record.
KINDS: list[tuple[str, str, str]] = [
    (r"^ab\b", "ab", "python -m bench.studies.ab"),
    (r"^soak\b", "soak", "python -m bench.studies.soak"),
    (r"^restart\b", "restart", "python -m bench.studies.restart"),
    (r"^startup\b", "startup", "python -m bench.studies.startup"),
    (r"^import\b", "import_export", "python -m bench.studies.import_export"),
    (r"^read-index-links\b", "read_index", "python -m bench.studies.read_index"),
    (r"^retrieval-study\b", "retrieval_ceiling", "python -m bench.studies.retrieval_ceiling"),
    (r"^retrieval\b", "retrieval", "python -m bench.studies.retrieval"),
    (r"^sensitivity\b", "sensitivity", "python -m bench.studies.sensitivity"),
    (r"^longmemeval\b", "longmemeval", "python -m bench.studies.longmemeval"),
    (r"^erasure-profile\b", "erasure_profile", "bench/erasure_profile.py (deleted)"),
    (r"^erasure-gone-ceiling\b", "erasure_gone_ceiling", "bench/erasure_gone_ceiling.py (deleted)"),
    (r"^erasure\b", "erasure", "python -m bench.studies.erasure"),
    (r"^redact\b", "redact", "python -m bench.studies.redact"),
    (r"^compaction-stack\b", "compaction", "python -m bench.studies.compaction"),
    (r"^compaction\b", "compaction_bench", "bench/compaction_bench.py (deleted)"),
    (r"^memtrace\b", "memtrace", "python -m bench.studies.soak --env LOOM_MEMTRACE_DIR=..."),
    (r"^memory\b", "memory_bench", "bench/memory_bench.py (deleted)"),
    (r"^ceiling\b", "ceiling", "bench/ceiling.py (deleted)"),
    (r"^search-cache-ab\b", "search_cache_ab", "bench/search_bench.py (deleted)"),
    (r"^search\b", "search_bench", "bench/search_bench.py (deleted)"),
    (r"^saved\b", "saved_bench", "bench/saved_bench.py (deleted)"),
    (r"^append\b", "append_bench", "bench/append_bench.py (deleted)"),
    (r"^job-payload\b", "job_payload", "bench/job_payload_bench.py (deleted)"),
    (r"^recovery\b", "recovery", "bench/recovery_bench.py (deleted)"),
    (r"^webhooks\b", "webhooks", "bench/webhook_bench.py (deleted)"),
    (r"^granularity\b", "granularity", "bench/granularity_bench.py (deleted)"),
]
# The harness statistics the records table shows (the JSON has more).
RECORD_STATS = {
    "append_plain": ("throughput", "p50"),
    "append_embedded": ("throughput", "p50"),
    "search": ("p50", "p95", "throughput", "p50, 1 client", "recall@10"),
    "saved_search": ("p50", "p95", "hit@10"),
    "bytes": ("total",),
    "erase": ("median",),
    "index_build": ("time",),
}


@dataclass
class Result:
    """One result: the files sharing a stem (its .json, .txt, .md), wherever they are."""

    stem: str
    date: str
    time: str
    kind: str
    command: str
    files: list[Path] = field(default_factory=list)
    commit: str = ""
    harness: dict[str, Any] | None = None  # the harness run's JSON
    headline: str = ""
    record_of: list[str] = field(default_factory=list)

    @property
    def sort_key(self) -> tuple[str, str, str]:
        started = str((self.harness or {}).get("meta", {}).get("started", ""))
        return (self.date, started[11:16].replace(":", "") or self.time or "0000", self.stem)


def _kind(rest: str) -> tuple[str, str]:
    notes = rest.endswith("-notes") or "-notes-" in rest
    for pattern, kind, command in KINDS:
        if re.search(pattern, rest):
            return (kind + "-notes" if notes else kind), command
    return ("other-notes" if notes else "other"), "—"


def _is_harness(doc: Any) -> bool:
    return isinstance(doc, dict) and "meta" in doc and "results" in doc and "targets" in doc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError):
        return None


def collect() -> list[Result]:
    by_stem: dict[str, Result] = {}
    for path in sorted([*RESULTS.glob("*"), *ARCHIVE.glob("*")]):
        if not path.is_file() or path == INDEX:
            continue
        stem = path.name.split(".", 1)[0]
        m = _STEM.match(stem)
        date, hhmm, rest = (m.group(1), m.group(2) or "", m.group(3)) if m else ("", "", stem)
        kind, command = _kind(rest)
        res = by_stem.setdefault(stem, Result(stem=stem, date=date, time=hhmm, kind=kind, command=command))
        res.files.append(path)
    for res in by_stem.values():
        _describe(res)
    return sorted(by_stem.values(), key=lambda r: r.sort_key)


def _describe(res: Result) -> None:
    for path in res.files:
        if path.suffix == ".json":
            doc = _read_json(path)
            if _is_harness(doc):
                res.harness = doc
                res.kind = "harness-smoke" if doc["meta"].get("mode") == "smoke" else "harness"
                res.command = " ".join(["python -m bench", *map(str, doc["meta"].get("argv") or [])])
                res.commit = str(doc["meta"].get("machine", {}).get("loom_commit", ""))
                res.headline = _harness_headline(doc)
                return
            if isinstance(doc, dict):
                revs = [str(doc[k]) for k in ("before_rev", "after_rev", "commit", "rev") if k in doc]
                res.commit = res.commit or " → ".join(revs)
    text = next((p for p in res.files if p.suffix in (".txt", ".md")), None)
    if text is not None:
        body = text.read_text(errors="replace")
        if not res.commit:
            m = _COMMIT.search(body)
            res.commit = m.group(1) if m else ""
        res.headline = _text_headline(body)
    elif not res.headline:
        doc = _read_json(res.files[0])
        res.headline = _json_headline(doc)


def _text_headline(body: str) -> str:
    """The first two lines that carry a figure."""
    lines = [ln.strip(" #|*-") for ln in body.splitlines()]
    picked = [ln for ln in lines if re.search(r"\d", ln) and len(ln) > 12][:2]
    return " / ".join(_cell(p, 110) for p in picked)


def _json_headline(doc: Any) -> str:
    if not isinstance(doc, dict):
        return ""
    nums = [f"{k} {v:g}" for k, v in doc.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return _cell(", ".join(nums[:4]), 160)


def _cell(text: str, width: int) -> str:
    """One table cell: no pipes, no paths outside the repository, no tracker numbers."""
    text = _OUTSIDE.sub("", text.replace("|", "/"))
    text = _TRACKER.sub("", text)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _scale(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if abs(v) < 1.5 else f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def _harness_headline(doc: dict[str, Any]) -> str:
    out = []
    for r in table_rows(doc):
        if (r["figure"], r["stat"]) in (("search", "p50"), ("append_plain", "throughput")) and r["loom"]:
            ratio = f" ({r['ratio']:.2f}x)" if r["ratio"] else ""
            out.append(
                f"{_scale(r['scale'])} {r['label']} {r['stat']} {_num(r['loom'])}/{_num(r['baseline'])} {r['unit']}{ratio}"
            )
    return "; ".join(out)


# -- records -------------------------------------------------------------------------------


@dataclass
class Record:
    scale: int
    figure: str
    label: str
    stat: str
    unit: str
    loom: float | None
    baseline: float | None
    ratio: float | None
    source: Result


def harness_records(results: Iterable[Result]) -> list[Record]:
    """Per (scale, figure, statistic): the newest harness run with a Loom value for it."""
    best: dict[tuple[int, str, str], Record] = {}
    for res in results:  # oldest first: a newer run replaces an older one
        if res.kind != "harness" or res.harness is None:
            continue
        for r in table_rows(res.harness):
            if r["stat"] not in RECORD_STATS.get(r["figure"], ()) or r["loom"] is None:
                continue
            best[(r["scale"], r["figure"], r["stat"])] = Record(
                scale=r["scale"],
                figure=r["figure"],
                label=r["label"],
                stat=r["stat"],
                unit=r["unit"],
                loom=r["loom"],
                baseline=r["baseline"],
                ratio=r["ratio"],
                source=res,
            )
    figures = list(RECORD_STATS)
    return sorted(
        best.values(),
        key=lambda rec: (rec.scale, figures.index(rec.figure), RECORD_STATS[rec.figure].index(rec.stat)),
    )


def mark_records(results: list[Result]) -> list[Record]:
    records = harness_records(results)
    for rec in records:
        tag = "harness"
        if tag not in rec.source.record_of:
            rec.source.record_of.append(tag)
    # The newest run of each harness mode stays current too: what `make bench-quick` and
    # `make bench` last printed, whichever run holds the record of each figure.
    last_run: dict[str, Result] = {}
    for res in results:
        if res.kind == "harness" and res.harness is not None:
            last_run[str(res.harness["meta"].get("mode", ""))] = res
    for mode, res in last_run.items():
        res.record_of.append(f"newest {mode} run")
    # A study's record: its files of the newest date and time (files named without a time
    # cannot be told apart within their day, so all of that day's stay records).
    newest: dict[str, tuple[str, str]] = {}
    for res in results:
        if not res.kind.startswith("harness"):
            newest[res.kind] = max(newest.get(res.kind, ("", "")), (res.date, res.time))
    for res in results:
        if not res.kind.startswith("harness") and (res.date, res.time) == newest[res.kind]:
            res.record_of.append(res.kind)
    return records


def moves(results: list[Result]) -> list[tuple[Path, Path]]:
    """(from, to) for every file to move: superseded ones into the archive, a record out of it."""
    out = []
    for res in results:
        home = RESULTS if res.record_of else ARCHIVE
        for path in res.files:
            if path.parent != home:
                out.append((path, home / path.name))
    return out


# -- writing ----------------------------------------------------------------------------------


def records_block(records: list[Record]) -> str:
    lines = [
        BEGIN,
        "",
        "| scale | figure | stat | Loom | Postgres + pgvector | Loom / baseline | run (commit) |",
        "|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        unit = f" {rec.unit}" if rec.unit else ""
        ratio = f"{rec.ratio:.2f}x" if rec.ratio is not None else "—"
        lines.append(
            f"| {_scale(rec.scale)} | {rec.label} | {rec.stat} | {_num(rec.loom)}{unit} | "
            f"{_num(rec.baseline)}{unit if rec.baseline is not None else ''} | {ratio} | "
            f"{rec.source.stem} ({rec.source.commit or '?'}) |"
        )
    lines += ["", END]
    return "\n".join(lines)


def render(results: list[Result], records: list[Record]) -> str:
    out = [
        "# Benchmark results",
        "",
        "Written by `python -m bench.index` from the files beside it (`--check` fails when it is not",
        "current). A file's commit is the one it measured where the file records it (the harness",
        "records it in `meta.machine.loom_commit`), `—` where it does not. **record** marks the",
        "figure of record of a metric: for the harness (`python -m bench`), the newest run with a",
        "Loom value for that scale, figure and statistic (and the newest run of each mode); for a",
        "study, its newest files. Files that",
        "are the record of nothing were superseded and live in `archive/`.",
        "",
        "## Figures of record: `python -m bench`",
        "",
        records_block(records),
        "",
        "## Studies: their newest result",
        "",
        "| kind | file | date | command | headline |",
        "|---|---|---|---|---|",
    ]
    for res in results:
        if not res.kind.startswith("harness") and res.record_of:
            out.append(
                f"| {res.kind} | {_files(res)} | {res.date} | `{res.command}` | {_cell(res.headline, 160)} |"
            )
    for title, where in (("## Current files", RESULTS), ("## Archive (superseded)", ARCHIVE)):
        out += [
            "",
            title,
            "",
            "| file | date | commit | command | headline | record |",
            "|---|---|---|---|---|---|",
        ]
        for res in results:
            if res.files[0].parent == where:
                mark = "**record**" if res.record_of else ""
                out.append(
                    f"| {_files(res)} | {res.date}{' ' + res.time if res.time else ''} | {res.commit or '—'} | "
                    f"`{res.command}` | {_cell(res.headline, 200)} | {mark} |"
                )
    return "\n".join(out) + "\n"


def _files(res: Result) -> str:
    rel = res.files[0].parent.relative_to(RESULTS)
    prefix = "" if str(rel) == "." else f"{rel}/"
    exts = ",".join(sorted(p.name.split(".", 1)[1] for p in res.files))
    return f"{prefix}{res.stem}.{{{exts}}}" if len(res.files) > 1 else f"{prefix}{res.files[0].name}"


def with_block(text: str, block: str) -> str:
    """``text`` with its figures-of-record block replaced by ``block``."""
    if BEGIN not in text or END not in text:
        raise ValueError("no figures-of-record markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def plan() -> tuple[list[tuple[Path, Path]], list[Result], list[Record]]:
    results = collect()
    records = mark_records(results)
    return moves(results), results, records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.index", description=__doc__.splitlines()[0])
    ap.add_argument("--archive", action="store_true", help="move superseded results to archive/")
    ap.add_argument("--check", action="store_true", help="fail if anything is not current; write nothing")
    args = ap.parse_args(argv)
    todo, results, records = plan()
    stale: list[str] = []
    if todo and args.archive and not args.check:
        ARCHIVE.mkdir(exist_ok=True)
        for src, dst in todo:
            src.rename(dst)
        todo, results, records = plan()
    stale += [f"{src.relative_to(REPO)} belongs in {dst.parent.relative_to(REPO)}/" for src, dst in todo]
    block = records_block(records)
    wanted = {INDEX: render(results, records)}
    for doc in DOCS:
        wanted[doc] = with_block(doc.read_text(), block)
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            if args.check:
                stale.append(f"{path.relative_to(REPO)} is not current")
            else:
                path.write_text(text)
    for line in stale:
        print(line, file=sys.stderr)
    if stale:
        print("run: python -m bench.index --archive", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
