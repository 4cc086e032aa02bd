"""Question: How soon does `loom serve` answer again after a child (worker, API, engine, Redis) is
killed, and where does that time go?

    python -m bench.studies.restart [--rounds 3] [--before REV]

Result: bench/results/<date>-restart.{json,txt} (last: 2026-12-02-restart).

Restart-to-answering after a SIGKILL of each child of ``loom serve``, itemised.

With ``--before REV`` that revision's build runs beside this checkout's (a temporary git
worktree), both up, one frozen while the other is measured, taking turns ABBA; the
ratios this/before are printed.

It starts ``loom serve`` on its embedded defaults (real MiniLM embedder) in a temporary
LOOM_HOME, then, `--rounds` times for each child (the worker, the API, the embedded
ClickHouse endpoint, redis-server), kills it with SIGKILL while probes run (an append
and a GET /healthz every 0.1 s) and times, from the kill:

* ``respawn``: until the supervisor started its successor (a new pid of that role):
  the restart backoff plus the supervisor's poll interval;
* ``answering``: until the service answers again: a probe append answered 200 with its
  turn embedded (the worker's and the backends' kills: the worker must be back too),
  or /healthz and a probe append answered 200 (the API's kill).

Where a Python child's time goes is measured beside it in the same run, with the stack
idle: a bare interpreter start, the imports of the API (``loom.api.main``) and of the
worker (``workers.main``), and loading the MiniLM model. ``answering - respawn``
less those is the child's own start-up (connecting, migrations check, arq start) and
the probes' granularity. Prints medians per child and writes
``<out>/<date>-restart.{json,txt}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.httpclient import HttpError, LeanClient
from bench.loom_stack import REPO, LoomStack
from bench.report import checkout_rev, save_run
from bench.studies.soak import NAMESPACE, serve_group, setup

CHILDREN = ["worker", "api", "clickhouse-endpoint", "redis-server"]
PROBE_EVERY_S = 0.1
GIVE_UP_S = 90.0
SETTLE_S = 2.0  # between kills; the same child of one stack is killed again only after every other


@dataclass
class Probe:
    sent: float
    answered: float = 0.0
    ok: bool = False
    embedded: bool = False


@dataclass
class Round:
    child: str
    respawn_s: float | None = None
    answering_s: float | None = None
    probes: list[Probe] = field(default_factory=list)


async def probe_loop(client: LeanClient, base: str, rnd: Round, t0: float, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    n = 0

    async def append(p: Probe) -> None:
        try:
            body = await client.post_json(
                "/v1/conversation.append",
                {
                    "namespace": NAMESPACE,
                    "thread_id": f"restart-{rnd.child}",
                    "role": "user",
                    "content": f"restart probe {rnd.child} {t0:.3f} {p.sent:.3f}",
                },
            )
            p.ok = True
            p.embedded = isinstance(body, dict) and body.get("embedding") == "embedded"
        except (HttpError, OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            p.ok = False
        p.answered = time.monotonic() - t0

    async with httpx.AsyncClient(timeout=5) as hc:

        async def health(p: Probe) -> None:
            try:
                p.ok = (await hc.get(f"{base}/healthz")).status_code == 200
            except httpx.HTTPError:
                p.ok = False
            p.answered = time.monotonic() - t0

        while not stop.is_set():
            n += 1
            p = Probe(time.monotonic() - t0)
            rnd.probes.append(p)
            task = loop.create_task(append(p) if n % 2 else health(p))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(PROBE_EVERY_S)
        for task in list(tasks):
            task.cancel()


async def kill_one(stack: LoomStack, client: LeanClient, child: str) -> Round:
    assert stack.proc is not None
    group = serve_group(stack.proc.pid)
    if child not in group:
        raise RuntimeError(f"no {child} in the serve group: {group}")
    old = group[child]
    rnd = Round(child)
    stop = asyncio.Event()
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    probing = asyncio.get_running_loop().create_task(probe_loop(client, stack.base_url, rnd, t0, stop))
    while time.monotonic() - t0 < GIVE_UP_S:
        now = time.monotonic() - t0
        if rnd.respawn_s is None:
            new = serve_group(stack.proc.pid).get(child)
            if new is not None and new != old:
                rnd.respawn_s = now
        if rnd.respawn_s is not None:
            answered = _answering(rnd, child)
            if answered is not None:
                rnd.answering_s = answered
                break
        await asyncio.sleep(0.01)
    stop.set()
    await probing
    return rnd


def _answering(rnd: Round, child: str) -> float | None:
    """When the service answered again (after the successor started)."""
    assert rnd.respawn_s is not None
    appends = [
        p for i, p in enumerate(rnd.probes) if i % 2 == 0 and p.answered and p.answered >= rnd.respawn_s
    ]
    healths = [
        p for i, p in enumerate(rnd.probes) if i % 2 == 1 and p.answered and p.answered >= rnd.respawn_s
    ]
    if child == "api":
        ok_a = [p.answered for p in appends if p.ok]
        ok_h = [p.answered for p in healths if p.ok]
        return max(min(ok_a), min(ok_h)) if ok_a and ok_h else None
    ok = [p.answered for p in appends if p.ok and p.embedded]
    return min(ok) if ok else None


def timed(code: str, runs: int = 3) -> float:
    """Median wall time of `python -c code` (the interpreter start included)."""
    times = []
    for _ in range(runs):
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)
        times.append(time.monotonic() - t)
    return statistics.median(times)


def start_costs(runs: int) -> dict[str, float]:
    bare = timed("pass", runs)
    api = timed("import loom.api.main", runs)
    worker = timed("import workers.main", runs)
    model = timed(
        "from loom.providers.embedders import build_embedder; e = build_embedder('minilm', "
        "intra_op_num_threads=1); e.load()",
        runs,
    )
    bare_emb = timed("import loom.providers.embedders", runs)
    return {
        "python_start_s": round(bare, 2),
        "api_imports_s": round(api - bare, 2),
        "worker_imports_s": round(worker - bare, 2),
        "model_load_s": round(model - bare_emb, 2),
    }


def med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 2) if vals else None


def _per_child(rounds: list[Round], children: list[str]) -> dict[str, Any]:
    return {
        c: {
            "respawn_median_s": med([r.respawn_s for r in rounds if r.child == c]),
            "answering_median_s": med([r.answering_s for r in rounds if r.child == c]),
            "answering_s": [
                None if r.answering_s is None else round(r.answering_s, 2) for r in rounds if r.child == c
            ],
            "respawn_s": [
                None if r.respawn_s is None else round(r.respawn_s, 2) for r in rounds if r.child == c
            ],
        }
        for c in children
    }


async def run(args: argparse.Namespace, stacks: dict[str, LoomStack], log: Any) -> dict[str, Any]:
    clients: dict[str, LeanClient] = {}
    for name, stack in stacks.items():
        for other in stacks.values():
            other.pause()
        stack.resume()
        token = setup(stack)
        clients[name] = LeanClient(stack.base_url, {"Authorization": f"Bearer {token}"}, timeout=30)
        await clients[name].post_json(
            "/v1/conversation.append",
            {"namespace": NAMESPACE, "thread_id": "warm", "role": "user", "content": "warm up"},
        )
    rounds: dict[str, list[Round]] = {name: [] for name in stacks}
    names = list(stacks)
    turn = 0
    for r in range(args.rounds):
        for child in args.children:
            # The builds take turns, ABBA, so that noise on a shared machine hits both alike.
            for name in names if turn % 2 == 0 else names[::-1]:
                for other in stacks.values():
                    other.pause()
                stacks[name].resume()
                await asyncio.sleep(SETTLE_S)
                rnd = await kill_one(stacks[name], clients[name], child)
                rounds[name].append(rnd)
                log(
                    f"  round {r + 1} {name:<7} {child:<20} respawn "
                    f"{rnd.respawn_s if rnd.respawn_s is None else round(rnd.respawn_s, 2)} s, answering "
                    f"{rnd.answering_s if rnd.answering_s is None else round(rnd.answering_s, 2)} s"
                )
            turn += 1
    for c in clients.values():
        await c.aclose()
    return {"builds": {name: _per_child(rs, args.children) for name, rs in rounds.items()}}


def render(r: dict[str, Any]) -> str:
    c = r["costs"]
    lines = [
        f"restart after SIGKILL, {r['rounds']} round(s) per build, medians (load avg at start "
        f"{r['loadavg_start']:.1f}); builds: {r['revs']}",
        f"{'build':<8} {'child':<20} {'respawn s':>10} {'answering s':>12}   all answering",
    ]
    builds = r["builds"]
    for build, children in builds.items():
        for name, x in children.items():
            lines.append(
                f"{build:<8} {name:<20} {x['respawn_median_s']!s:>10} {x['answering_median_s']!s:>12}   "
                f"{x['answering_s']}"
            )
    if "before" in builds:
        lines.append("")
        for name, x in builds["this"].items():
            b = builds["before"][name]["answering_median_s"]
            a = x["answering_median_s"]
            if a and b:
                lines.append(f"answering, this/before, {name:<20} {a / b:.3f}")
    lines += [
        "",
        "start costs measured beside it (median of runs, stacks frozen): "
        f"python start {c['python_start_s']} s, API imports {c['api_imports_s']} s, "
        f"worker imports {c['worker_imports_s']} s, MiniLM load {c['model_load_s']} s",
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.studies.restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--children", type=lambda s: [x for x in s.split(",") if x], default=CHILDREN)
    p.add_argument("--cost-runs", type=int, default=3)
    p.add_argument(
        "--before", help="also run this git revision's build, the two taking turns (ratios this/before)"
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--tag", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    load_start = os.getloadavg()[0]
    stacks = {"this": LoomStack(embedder="minilm")}
    tree = None
    if args.before:
        from bench.studies.ab import drop_worktree, worktree

        tree = worktree(args.before)
        stacks["before"] = LoomStack(embedder="minilm", cwd=tree, env={"PYTHONPATH": str(tree)})
    try:
        for stack in stacks.values():
            stack.start(log)
            stack.pause()
        result = asyncio.run(run(args, stacks, log))
        for stack in stacks.values():
            stack.pause()  # the start costs are measured with the stacks frozen
        result["costs"] = start_costs(args.cost_runs)
    finally:
        for stack in stacks.values():
            stack.stop()
        if tree is not None:
            drop_worktree(tree)
    result["revs"] = {
        "this": checkout_rev(REPO),
        **({"before": args.before} if args.before else {}),
    }
    result["rounds"] = args.rounds
    result["loadavg_start"] = load_start
    result["machine"] = {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()}
    text = render(result)
    save_run(
        args.out, f"{datetime.now(UTC):%Y-%m-%d}-restart{('-' + args.tag) if args.tag else ''}", result, text
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
