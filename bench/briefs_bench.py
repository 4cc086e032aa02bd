"""Session briefs: brief_save with the deterministic builder on 4,000 events, and brief_get.

Run: ``.venv/bin/python bench/briefs_bench.py [--rounds N] [--events N]``

Starts its own backends (the embedded ClickHouse endpoint and a redis-server in a
temporary directory, or the servers named by LOOM_TEST_CLICKHOUSE_URL /
LOOM_TEST_REDIS_URL), applies the schema, and drives the ops through the HTTP API
in-process (ASGI: auth, validation of 4,000 events, the op, the store) with the stock
fake LLM, so every save is revised by the deterministic builder. Each save revises the
same brief (read, lease, write two rows). Prints p50/p95/max in milliseconds, and the
op alone (no HTTP layer) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from loom.api.app import create_app  # noqa: E402
from loom.auth.principal import Principal, Role  # noqa: E402
from loom.auth.tokens import mint  # noqa: E402
from loom.ops import briefs as ops  # noqa: E402
from loom.ops.briefs.events import Event  # noqa: E402
from loom.services import open_services  # noqa: E402
from loom.settings import Settings  # noqa: E402
from loom.store.schema import prepare  # noqa: E402

FILES = [f"loom/{pkg}/{name}.py" for pkg in ("api", "ops", "store", "sdk") for name in ("core", "util", "io")]
_SAMPLE = (
    "the exporter retries the upload after a timeout while the ledger migration waits for the "
    "lock so we moved the report job and added backoff with jitter to the client"
)
WORDS = _SAMPLE.split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def session_events(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """A coding session's events: prose, reads, edits, commands, errors, tools, ~150 chars each."""
    out: list[dict[str, Any]] = [{"kind": "user", "text": "Add retries with backoff to the upload client"}]
    while len(out) < n:
        roll = rng.random()
        if roll < 0.2:
            out.append({"kind": "assistant", "text": sentence(rng, 25)})
        elif roll < 0.35:
            out.append({"kind": "read", "path": rng.choice(FILES)})
        elif roll < 0.55:
            out.append({"kind": "edit", "path": rng.choice(FILES), "text": sentence(rng, 12)})
        elif roll < 0.75:
            out.append(
                {
                    "kind": "command",
                    "text": "pytest -q tests/" + rng.choice(FILES)[5:],
                    "exit_code": rng.choice((0, 0, 0, 1)),
                }
            )
        elif roll < 0.82:
            out.append(
                {"kind": "error", "path": rng.choice(FILES), "text": "AssertionError: " + sentence(rng, 10)}
            )
        elif roll < 0.92:
            out.append(
                {
                    "kind": "tool",
                    "text": f"web_fetch https://docs.example.test/{rng.randrange(999)} " + sentence(rng, 6),
                }
            )
        else:
            out.append({"kind": "note", "text": sentence(rng, 20)})
    out[-1] = {"kind": "summary", "text": sentence(rng, 120)}
    return out[:n]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report(label: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"{label:<58} n={len(ms):<4} p50={statistics.median(ms):8.1f} ms  p95={pct(ms, 0.95):8.1f} ms  "
        f"max={max(ms):8.1f} ms"
    )


async def run(rounds: int, n_events: int, home: Path) -> None:
    from loom.embedded.clickhouse_endpoint import start_endpoint
    from loom.embedded.redis_server import start_redis

    started: list[Any] = []
    ch_url = os.environ.get("LOOM_TEST_CLICKHOUSE_URL", "")
    redis_url = os.environ.get("LOOM_TEST_REDIS_URL", "")
    try:
        if not ch_url:
            endpoint = start_endpoint(home / "clickhouse")
            started.append(endpoint)
            ch_url = endpoint.url
        if not redis_url:
            server = start_redis(home / "redis")
            started.append(server)
            redis_url = server.url
        opts: dict[str, Any] = {
            "home": home,
            "clickhouse_url": ch_url,
            "redis_url": redis_url,
            "embedder": "fake",
            "llm": "fake",
            "clickhouse_database": f"loom_bench_{secrets.token_hex(4)}",
        }
        settings = Settings(**opts)
        prepare(settings, ch_url)
        svc = await open_services(settings, ch_url, redis_url)
        try:
            await bench(svc, rounds, n_events)
        finally:
            await svc.close()
    finally:
        for proc in reversed(started):
            proc.stop()


async def bench(svc: Any, rounds: int, n_events: int) -> None:
    rng = random.Random(7)
    ns = f"bench{secrets.token_hex(3)}"
    token = mint(svc.ch, [ns], "writer").token
    headers = {"Authorization": f"Bearer {token}"}
    batches = [session_events(rng, n_events) for _ in range(4)]
    chars = sum(len(e.get("text", "")) + len(e.get("path", "")) for e in batches[0])
    print(
        f"backends up; {n_events} events per save (~{chars:,} characters), fake LLM -> deterministic builder"
    )

    from tests.asgi import in_process

    async with in_process(create_app(svc), "http://bench", timeout=120) as client:

        async def save(i: int, key: str) -> float:
            body = {
                "namespace": ns,
                "project": "bench",
                "branch": key,
                "session_id": f"s{i}",
                "event_cursor": f"c{i}",
                "events": batches[i % len(batches)],
            }
            t0 = time.perf_counter()
            r = await client.post("/v1/session.brief_save", json=body, headers=headers)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200 and r.json()["author"] == "deterministic", r.text
            return elapsed

        async def get(key: str, full: bool) -> float:
            t0 = time.perf_counter()
            r = await client.post(
                "/v1/session.brief_get",
                headers=headers,
                json={"namespace": ns, "brief_key": f"auto/bench/{key}", "full": full},
            )
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200, r.text
            return elapsed

        for i in range(3):  # warm up: imports, connections, first parts
            await save(i, "warm")
            await get("warm", False)
        saves = [await save(i, "main") for i in range(rounds)]
        report(f"HTTP session.brief_save, {n_events} events (same brief)", saves)
        fresh = [await save(i, f"b{i}") for i in range(rounds)]
        report(f"HTTP session.brief_save, {n_events} events (new brief each)", fresh)
        gets = [await get("main", False) for _ in range(rounds * 2)]
        report("HTTP session.brief_get", gets)
        gets_full = [await get("main", True) for _ in range(rounds * 2)]
        report("HTTP session.brief_get full=true", gets_full)

    who = Principal("bench", (ns,), Role.writer)
    events = [
        [Event(e["kind"], e.get("text", ""), e.get("path", ""), e.get("exit_code")) for e in b]
        for b in batches
    ]
    op_saves = []
    for i in range(rounds):
        t0 = time.perf_counter()
        await ops.brief_save(
            svc,
            who,
            ns,
            project="bench",
            branch="op",
            session_id=f"s{i}",
            event_cursor=f"c{i}",
            events=events[i % len(events)],
        )
        op_saves.append(time.perf_counter() - t0)
    report(f"op brief_save only, {n_events} events", op_saves)
    op_gets = []
    for _ in range(rounds * 2):
        t0 = time.perf_counter()
        await ops.brief_get(svc, who, ns, brief_key="auto/bench/op")
        op_gets.append(time.perf_counter() - t0)
    report("op brief_get only", op_gets)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--events", type=int, default=4_000)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="loomb-", dir="/tmp"))
    try:
        asyncio.run(run(args.rounds, args.events, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
