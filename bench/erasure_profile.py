"""Where erasure.request's time goes: every ClickHouse statement on its way to the answer.

Run: ``.venv/bin/python bench/erasure_profile.py [--turns 100000] [--users 100] [--erase 5]
[--before REV]``

With ``--before REV`` the request path as it was at git revision REV (its
loom/ops/erasure/requesting.py, loom/store/erasure.py and loom/ops/memory/erasing.py,
loaded side by side with today's) is measured in the same run, users alternating
between the two, so the ratio holds however loaded the machine is.

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


def _instrument(store: Any) -> None:
    for name in dir(store):
        fn = getattr(store, name)
        mine = callable(fn) and getattr(fn, "__module__", "") == store.__name__ and not isinstance(fn, type)
        if mine and not name.startswith("_"):
            setattr(store, name, _timed(name, fn))


def _old_modules(rev: str) -> Any:
    """The request path at `rev`, as modules of their own (today's are left as they are)."""
    import subprocess
    import types

    def load(name: str, path: str, swap: dict[str, str]) -> types.ModuleType:
        src = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        text = src.decode()
        for a, b in swap.items():
            text = text.replace(a, b)
        mod = types.ModuleType(name)
        mod.__file__ = str(ROOT / path)
        sys.modules[name] = mod
        exec(compile(text, f"{rev}:{path}", "exec"), mod.__dict__)
        return mod

    load("_before_store", "loom/store/erasure.py", {})
    load(
        "_before_erasing",
        "loom/ops/memory/erasing.py",
        {"from loom.store import erasure as erasure_store": "import _before_store as erasure_store"},
    )
    return load(
        "_before_requesting",
        "loom/ops/erasure/requesting.py",
        {
            "from loom.store import erasure as store": "import _before_store as store",
            "from loom.ops.memory import erasing as memory_erasing": "import _before_erasing as memory_erasing",
        },
    )


async def profile(stack: LoomStack, users: list[str], variants: dict[str, Any]) -> dict[str, Any]:
    from loom.auth.principal import Principal, Role
    from loom.services import open_services
    from loom.settings import Settings

    svc = await open_services(Settings(home=stack.home), stack.clickhouse_url, stack.redis_url)
    who = Principal(token_id="bench", namespaces=(MAIN_NS,), role=Role.admin)
    totals: dict[str, list[float]] = defaultdict(list)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    names = list(variants)
    try:
        for i, u in enumerate(users):
            variant = names[i % len(names)]
            _spans.clear()
            _t0[0] = time.perf_counter()
            await variants[variant].request(
                svc, who, user_id=u, namespaces=[MAIN_NS], namespace_list=None, purge=False
            )
            total = (time.perf_counter() - _t0[0]) * 1000
            totals[variant].append(total)
            log(f"erase {u} ({variant}): {total:.0f} ms (load {load_avg()})")
            for name, a, b in sorted(_spans, key=lambda s: s[1]):
                log(f"   {a:7.1f} .. {b:7.1f}  {b - a:6.1f} ms  {name}")
                per[variant][name].append(b - a)
            await asyncio.sleep(3)  # let the removal job run before the next user
    finally:
        await svc.close()
    out: dict[str, Any] = {"load_avg_end": load_avg()}
    for variant in names:
        medians = {k: statistics.median(v) for k, v in per[variant].items()}
        log(
            f"[{variant}] median per statement (ms): "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(medians.items()))
        )
        p50 = statistics.median(totals[variant])
        log(f"[{variant}] total p50 {p50:.0f} ms; runs {[round(t) for t in totals[variant]]}")
        out[variant] = {"p50_ms": p50, "runs_ms": totals[variant], "statement_p50_ms": medians}
    if "before" in out:
        out["after_over_before"] = out["after"]["p50_ms"] / out["before"]["p50_ms"]
        log(f"after / before (p50): {out['after_over_before']:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--erase", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--before", default="", help="git revision whose request path to measure alongside")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = ap.parse_args()
    from loom.ops.erasure import requesting
    from loom.store import erasure as store
    from loom.store import search_marks

    variants: dict[str, Any] = {"after": requesting}
    _instrument(store)
    if args.before:
        variants = {"before": _old_modules(args.before), "after": requesting}
        _instrument(sys.modules["_before_store"])
    search_marks.record = _timed("search_marks.record", search_marks.record)
    stack = LoomStack(embedder="fake")
    try:
        stack.start(log)
        bulk_load(stack.clickhouse_url, MAIN_NS, args.turns, args.users, vectors=True, seed=args.seed)
        n = args.erase * len(variants)
        step = max(1, args.users // n)
        users = [f"u{i:04d}" for i in range(1, args.users, step)][:n]
        result = asyncio.run(profile(stack, users, variants))
    finally:
        stack.stop()
    if args.out:
        import json

        args.out.write_text(json.dumps({"turns": args.turns, "users": args.users, **result}, indent=2))
        log(f"results: {args.out}")


if __name__ == "__main__":
    main()
