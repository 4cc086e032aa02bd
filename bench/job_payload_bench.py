"""Encode/decode cost of the append path's embedding job payload: the typed, versioned
payload (loom.jobs.EmbedTurnsJob) against the positional tuples it replaced.

Run: ``.venv/bin/python bench/job_payload_bench.py [--rounds N]``

No backends: it times what the API does to enqueue a job (build the payload, pickle it
as arq does) and what the worker does to read it (unpickle, turn it back into
EmbedTurn objects), for jobs of 1, 8, 32 and 256 turns (~200-character texts). Prints
the median microseconds per job of each side, the wire size, and the ratio new/old.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loom import jobs  # noqa: E402
from loom.jobs import EmbedTurn  # noqa: E402


def _turns(n: int) -> list[EmbedTurn]:
    now = datetime.now(UTC)
    return [
        EmbedTurn(
            namespace="bench-ns",
            agent="default",
            thread_id=f"thread-{i % 7}",
            msg_id=f"m-{i:08x}",
            role="user" if i % 2 else "assistant",
            run_id="run-1",
            user_id="user-1",
            ts=now,
            text=("a typical turn of a coding session, about two hundred characters " * 3)[:200],
        )
        for i in range(n)
    ]


# -- the replaced format: positional tuples (EmbedTurn.pack / unpack) ---------------------


def _old_encode(turns: list[EmbedTurn]) -> bytes:
    payload = {
        "turns": [
            (
                t.namespace,
                t.agent,
                t.thread_id,
                t.msg_id,
                t.role,
                t.run_id,
                t.user_id,
                t.ts,
                t.text,
                t.is_summary,
            )
            for t in turns
        ],
        "at": 1,
        "gate": "g",
        "job": "j",
        "reply": "r",
    }
    return pickle.dumps(payload)


def _old_decode(wire: bytes) -> list[EmbedTurn]:
    return [EmbedTurn(*t) for t in pickle.loads(wire)["turns"]]


# -- the typed payload ---------------------------------------------------------------------


def _new_encode(turns: list[EmbedTurn]) -> bytes:
    return pickle.dumps(jobs.build(jobs.EmbedTurnsJob, job="j", reply="r", turns=turns, at=1, gate="g"))


def _new_decode(wire: bytes) -> list[EmbedTurn]:
    return jobs.read(jobs.EmbedTurnsJob, pickle.loads(wire)).turns


def _median_us(fn: Callable[[], Any], rounds: int) -> float:
    inner = 20
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=51)
    args = parser.parse_args()
    print(f"median µs per job over {args.rounds} rounds (noisy on a shared 2-core machine)")
    print(f"{'turns':>6} {'side':>7} {'old µs':>9} {'new µs':>9} {'new/old':>8} {'old B':>8} {'new B':>8}")
    for n in (1, 8, 32, 256):
        turns = _turns(n)
        old_wire, new_wire = _old_encode(turns), _new_encode(turns)
        assert _old_decode(old_wire) == _new_decode(new_wire) == turns
        enc_old = _median_us(lambda: _old_encode(turns), args.rounds)  # noqa: B023
        enc_new = _median_us(lambda: _new_encode(turns), args.rounds)  # noqa: B023
        dec_old = _median_us(lambda: _old_decode(old_wire), args.rounds)  # noqa: B023
        dec_new = _median_us(lambda: _new_decode(new_wire), args.rounds)  # noqa: B023
        for side, old, new in (("API", enc_old, enc_new), ("worker", dec_old, dec_new)):
            print(
                f"{n:>6} {side:>7} {old:>9.1f} {new:>9.1f} {new / old:>8.2f} {len(old_wire):>8} {len(new_wire):>8}"
            )


if __name__ == "__main__":
    main()
