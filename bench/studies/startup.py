"""Question: How long does `loom serve` take to answer /healthz on a new home and on an existing
one?

    python -m bench.studies.startup [--rounds 5] [--before REV]

Result: bench/results/<date>-<time>-startup.{json,txt} (last: 2026-12-03-1503-startup).

How long `loom serve` takes to answer /healthz, on a new home and on an existing one.

Each start is ``loom serve`` on its embedded defaults (real MiniLM embedder, as `make
run` starts it), timed from its launch to the first 200 of ``GET /healthz`` (polled
every 50 ms). Per round and build: a new home (the backends' first start and every
migration applied), then a second start on that home once the first stopped (nothing
to migrate). With ``--before REV`` that revision's build (a temporary git worktree)
takes turns with this checkout's, ABBA, and the ratios this/before are printed. Each
build starts once unmeasured first, so both run with their modules compiled.
``--drop-caches`` (root) empties the page cache before every start: the first start
after a boot, or on a machine that has not run Loom for a while.

Prints the median and every value per build and case; writes
``<out>/<date>-startup[-tag].{json,txt}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.loom_stack import REPO, LoomStack
from bench.report import checkout_rev, save_run

CASES = ("new_home", "existing_home")
POLL_S = 0.05


def _drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _start_once(src: Path, home: Path, drop_caches: bool) -> float:
    if drop_caches:
        _drop_page_cache()
    stack = LoomStack(home=home, cwd=src, env={"PYTHONPATH": str(src)})
    try:
        stack.start(log=lambda _line: None, poll_s=POLL_S)
        return round(stack.healthy_after_s, 3)
    finally:
        stack.stop()


def _round(src: Path, drop_caches: bool) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="loom-startup-"))
    try:
        first = _start_once(src, home, drop_caches)
        again = _start_once(src, home, drop_caches)
        return {"new_home": first, "existing_home": again}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(builds: dict[str, Path], rounds: int, drop_caches: bool) -> dict[str, Any]:
    for src in builds.values():
        _round(src, drop_caches=False)  # unmeasured: compiles the build's modules
    seen: dict[str, dict[str, list[float]]] = {name: {c: [] for c in CASES} for name in builds}
    order = list(builds)
    for i in range(rounds):
        for name in order if i % 2 == 0 else order[::-1]:
            times = _round(builds[name], drop_caches)
            for case in CASES:
                seen[name][case].append(times[case])
            print(f"round {i + 1} {name}: {times}", flush=True)
    return {
        name: {c: {"median_s": statistics.median(v), "all_s": v} for c, v in cases.items()}
        for name, cases in seen.items()
    }


def render(r: dict[str, Any]) -> str:
    caches = "page cache dropped before each start" if r["drop_caches"] else "page cache warm"
    lines = [
        f"loom serve to /healthz 200, {r['rounds']} round(s) per build, medians ({caches}; "
        f"{r['machine']['cores']} cores); builds: {r['revs']}",
        f"{'build':<8} {'case':<14} {'median s':>9}   all",
    ]
    builds = r["builds"]
    for name, cases in builds.items():
        for case, x in cases.items():
            lines.append(f"{name:<8} {case:<14} {x['median_s']:>9.2f}   {x['all_s']}")
    if "before" in builds:
        lines.append("")
        for case in CASES:
            a, b = builds["this"][case]["median_s"], builds["before"][case]["median_s"]
            lines.append(f"{case}, this/before: {a / b:.3f}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.studies.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", help="also run this git revision's build, taking turns (ratios this/before)")
    p.add_argument("--drop-caches", action="store_true", help="empty the page cache before each start (root)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--tag", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    builds = {"this": REPO}
    tree = None
    if args.before:
        from bench.studies.ab import drop_worktree, worktree

        tree = builds["before"] = worktree(args.before)
    try:
        result: dict[str, Any] = {"builds": run(builds, args.rounds, args.drop_caches)}
    finally:
        if tree is not None:
            drop_worktree(tree)
    result["revs"] = {
        "this": checkout_rev(REPO),
        **({"before": args.before} if args.before else {}),
    }
    result |= {"rounds": args.rounds, "drop_caches": args.drop_caches}
    result["machine"] = {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()}
    text = render(result)
    save_run(
        args.out,
        f"{datetime.now(UTC):%Y-%m-%d-%H%M}-startup{('-' + args.tag) if args.tag else ''}",
        result,
        text,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
