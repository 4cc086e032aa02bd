"""Where erasure.request's time goes: every ClickHouse statement on its way to the answer.

Run: ``.venv/bin/python bench/erasure_profile.py [--turns 100000] [--users 100] [--erase 5]``

It starts the embedded stack as bench/erasure_bench.py does, loads the same namespace,
then calls the op in this process (no HTTP) with every function of loom.store.erasure
and the search-mark record wrapped in a timer, and prints, per erased user, a timeline:
each statement's start and end (ms since the request began), so which ones run one
after another and which overlap shows; then the median per statement and of the total.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.erasure_bench import MAIN_NS, bulk_load, load_avg, log  # noqa: E402
from bench.loom_stack import LoomStack  # noqa: E402

_spans: list[tuple[str, float, float]] = []
_t0 = [0.0]
_lock = threading.Lock()


def _timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            end = time.perf_counter()
            with _lock:
                _spans.append((name, (start - _t0[0]) * 1000, (end - _t0[0]) * 1000))

    return wrapper


def _instrument() -> None:
    from loom.store import erasure as store
    from loom.store import search_marks

    for name in dir(store):
        fn = getattr(store, name)
        if callable(fn) and getattr(fn, "__module__", "") == store.__name__ and not isinstance(fn, type):
            setattr(store, name, _timed(name, fn))
    search_marks.record = _timed("search_marks.record", search_marks.record)


async def profile(stack: LoomStack, users: list[str]) -> dict[str, Any]:
    from loom.auth.principal import Principal, Role
    from loom.ops.erasure import requesting
    from loom.services import open_services
    from loom.settings import Settings

    svc = await open_services(Settings(home=stack.home), stack.clickhouse_url, stack.redis_url)
    who = Principal(token_id="bench", namespaces=(MAIN_NS,), role=Role.admin)
    totals: list[float] = []
    per: dict[str, list[float]] = defaultdict(list)
    try:
        for u in users:
            _spans.clear()
            _t0[0] = time.perf_counter()
            await requesting.request(
                svc, who, user_id=u, namespaces=[MAIN_NS], namespace_list=None, purge=False
            )
            total = (time.perf_counter() - _t0[0]) * 1000
            totals.append(total)
            log(f"erase {u}: {total:.0f} ms (load {load_avg()})")
            for name, a, b in sorted(_spans, key=lambda s: s[1]):
                log(f"   {a:7.1f} .. {b:7.1f}  {b - a:6.1f} ms  {name}")
                per[name].append(b - a)
            await asyncio.sleep(3)  # let the removal job run before the next user
    finally:
        await svc.close()
    medians = {k: statistics.median(v) for k, v in per.items()}
    log("median per statement (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(medians.items())))
    log(f"total p50 {statistics.median(totals):.0f} ms; runs {[round(t) for t in totals]}")
    return {"p50_ms": statistics.median(totals), "runs_ms": totals, "statement_p50_ms": medians}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--erase", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    _instrument()
    stack = LoomStack(embedder="fake")
    try:
        stack.start(log)
        bulk_load(stack.clickhouse_url, MAIN_NS, args.turns, args.users, vectors=True, seed=args.seed)
        step = max(1, args.users // args.erase)
        users = [f"u{i:04d}" for i in range(1, args.users, step)][: args.erase]
        asyncio.run(profile(stack, users))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
