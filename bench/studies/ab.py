"""Question: Does a change make append or search faster or slower? Two builds' stacks run side by
side in one run, taking turns, so the ratio holds on a loaded machine.

    python -m bench.studies.ab --before REV [--after REV] [--rounds 4]

Result: bench/results/<date>-ab-<tag>.{json,txt} (last: 2026-12-02-ab-split).

Append and search, two builds of Loom side by side in ONE run: before/after ratios.

Each build runs as ``loom serve`` on its embedded defaults (real MiniLM embedder) in a
temporary LOOM_HOME, from a temporary ``git worktree`` of its revision (``--after``
defaults to this checkout as it is, uncommitted changes included). Both stacks are up
for the whole run; one is frozen (SIGSTOP) while the other is measured, and the builds
take turns, in the order ABBA BAAB ..., so that noise on a shared machine hits both
alike. Each turn runs two phases over HTTP:

* append: `--clients` closed-loop clients, single-turn user/assistant appends of
  ~200-character texts (each embedded by the worker before it answers), for
  `--append-seconds`: turns/s, median and p99 latency;
* search: `--search-clients` closed-loop clients of conversation.search (text queries,
  embedded in the API) over the namespace the appends fill, for `--search-seconds`:
  queries/s, median and p99.

Prints, per figure, the median over rounds of each build and the ratio after/before;
writes ``<out>/<date>-ab-<tag>.{json,txt}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.httpclient import HttpError, LeanClient
from bench.loom_stack import REPO, LoomStack
from bench.report import checkout_rev, save_run
from bench.studies.soak import NAMESPACE, WORDS, setup


def worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="loom-ab-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True, capture_output=True
    )
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


class Build:
    def __init__(self, name: str, src: Path) -> None:
        self.name = name
        self.src = src
        # The build's own code: its checkout first on the path of every process.
        self.stack = LoomStack(embedder="minilm", cwd=src, env={"PYTHONPATH": str(src)})
        self.client: LeanClient | None = None
        self.seq = 0

    def start(self, log: Any) -> None:
        self.stack.start(log)
        token = setup(self.stack)
        self.client = LeanClient(self.stack.base_url, {"Authorization": f"Bearer {token}"}, timeout=120)


async def closed(clients: int, seconds: float, one: Any) -> tuple[float, list[float], int]:
    lat: list[float] = []
    errors = 0
    end = time.monotonic() + seconds

    async def client() -> None:
        nonlocal errors
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                await one()
            except (HttpError, OSError, asyncio.IncompleteReadError):
                errors += 1
                continue
            lat.append(time.perf_counter() - t)

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(lat) / (time.monotonic() - t0), lat, errors


def q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] * 1000.0 if s else float("nan")


async def phases(b: Build, args: argparse.Namespace, rng: random.Random) -> dict[str, float]:
    assert b.client is not None
    client = b.client

    async def append() -> None:
        b.seq += 1
        text = f"{b.seq} " + " ".join(rng.choice(WORDS) for _ in range(28))
        await client.post_json(
            "/v1/conversation.append",
            {
                "namespace": NAMESPACE,
                "thread_id": f"ab-{b.seq % 64}",
                "role": "user" if b.seq % 2 else "assistant",
                "content": text,
            },
        )

    async def search() -> None:
        query = " ".join(rng.choice(WORDS) for _ in range(6))
        await client.post_json(
            "/v1/conversation.search", {"namespace": NAMESPACE, "query": query, "limit": 10}
        )

    a_rate, a_lat, a_err = await closed(args.clients, args.append_seconds, append)
    s_rate, s_lat, s_err = await closed(args.search_clients, args.search_seconds, search)
    return {
        "append_turns_per_s": a_rate,
        "append_median_ms": q(a_lat, 0.5),
        "append_p99_ms": q(a_lat, 0.99),
        "search_per_s": s_rate,
        "search_median_ms": q(s_lat, 0.5),
        "search_p99_ms": q(s_lat, 0.99),
        "errors": a_err + s_err,
        "loadavg": os.getloadavg()[0],
    }


async def run(
    args: argparse.Namespace, before: Build, after: Build, log: Any
) -> dict[str, list[dict[str, float]]]:
    rng = random.Random(args.seed)
    out: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    builds = {"before": before, "after": after}
    # Warm both (model loads, first parts), each alone.
    for name, b in builds.items():
        other = after if b is before else before
        other.stack.pause()
        b.stack.resume()
        await phases(b, argparse.Namespace(**{**vars(args), "append_seconds": 5, "search_seconds": 3}), rng)
        log(f"  warmed {name}")
    for r in range(args.rounds):
        # ABBA: round 1 before then after, round 2 after then before, and so on.
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            b = builds[name]
            other = builds["after" if name == "before" else "before"]
            other.stack.pause()
            b.stack.resume()
            await asyncio.sleep(1.0)
            fig = await phases(b, args, rng)
            out[name].append(fig)
            log(
                f"  round {r + 1} {name:<6} append {fig['append_turns_per_s']:6.1f}/s med {fig['append_median_ms']:7.1f} ms"
                f" | search {fig['search_per_s']:6.1f}/s med {fig['search_median_ms']:7.1f} ms"
                f" | errors {fig['errors']:.0f} | load {fig['loadavg']:.1f}"
            )
    return out


FIGURES = [
    ("append_turns_per_s", "append turns/s", True),
    ("append_median_ms", "append median ms", False),
    ("append_p99_ms", "append p99 ms", False),
    ("search_per_s", "search queries/s", True),
    ("search_median_ms", "search median ms", False),
    ("search_p99_ms", "search p99 ms", False),
]


def summarise(raw: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for key, _label, _higher in FIGURES:
        b = statistics.median(x[key] for x in raw["before"])
        a = statistics.median(x[key] for x in raw["after"])
        summary[key] = {
            "before": round(b, 1),
            "after": round(a, 1),
            "ratio_after_before": round(a / b, 3) if b else None,
        }
    return summary


def render(result: dict[str, Any]) -> str:
    lines = [
        f"A/B: before {result['before_rev']} vs after {result['after_rev']}, {result['rounds']} rounds each "
        f"(medians over rounds; load avg {result['loadavg_start']:.1f} at start)",
        f"{'figure':<20} {'before':>9} {'after':>9} {'after/before':>13}  better when",
    ]
    for key, label, higher in FIGURES:
        s = result["summary"][key]
        lines.append(
            f"{label:<20} {s['before']:>9} {s['after']:>9} {s['ratio_after_before']!s:>13}  {'higher' if higher else 'lower'}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.studies.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the 'before' build")
    p.add_argument("--after", help="git revision of the 'after' build (default: this checkout as it is)")
    p.add_argument("--rounds", type=int, default=4, help="turns per build (default 4)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--search-clients", type=int, default=4)
    p.add_argument("--append-seconds", type=float, default=15.0)
    p.add_argument("--search-seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--tag", default="ab")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    load_start = os.getloadavg()[0]
    trees = [worktree(args.before)]
    after_src = REPO
    if args.after:
        trees.append(worktree(args.after))
        after_src = trees[-1]
    before, after = Build("before", trees[0]), Build("after", after_src)
    try:
        for b in (before, after):
            b.start(log)
            b.stack.pause()
        raw = asyncio.run(run(args, before, after, log))
    finally:
        for b in (before, after):
            b.stack.stop()
        for t in trees:
            drop_worktree(t)
    result = {
        "before_rev": args.before,
        "after_rev": args.after or checkout_rev(REPO),
        "rounds": args.rounds,
        "loadavg_start": load_start,
        "summary": summarise(raw),
        "raw": raw,
        "machine": {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()},
    }
    text = render(result)
    save_run(args.out, f"{datetime.now(UTC):%Y-%m-%d}-{args.tag}", result, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
