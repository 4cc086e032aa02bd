"""Question: How well does the sensitivity screen catch each kind of sensitive text, how often does
it flag ordinary text, and what does it cost per turn?

    python -m bench.studies.sensitivity [--corpus tests/data/sensitivity_corpus.jsonl] [--rounds 2000]

Result: bench/results/<date>-<time>-sensitivity.{json,txt} (last: 2026-12-01-2258-sensitivity).

The sensitivity screen: recall and false-positive rate per kind, and its cost per turn.

Run: ``python -m bench.studies.sensitivity [--corpus tests/data/sensitivity_corpus.jsonl]
[--rounds 2000] [--out bench/results] [--baseline old_sensitivity.py]`` (the families of
tests/data/sensitivity_families.jsonl: ``--corpus`` that file).

``--baseline`` times another version of the module (e.g. ``git show <rev>:loom/sensitivity.py``)
on the same texts in the same run and prints the CPU-time ratio, which stays meaningful on a
loaded machine where the absolute figures do not.

Quality: every line of the labelled corpus (tests/data/sensitivity_corpus.jsonl, made by
tests/data/make_sensitivity_corpus.py) goes through ``loom.sensitivity.reads_as_high``.
Recall is counted over the lines labelled ``high``, the false-positive rate over the lines
labelled ``plain``, both per kind and overall. Misses and false positives are listed by kind
and line number, never by their text (the corpus is fake, but the habit stays).

Cost: the screen runs on every append, so it is timed on the turn sizes an append sees:
200 and 2,000 characters of (a) ordinary chat prose and logs, and (b) text dense with
near-miss shapes (digits, dates, hashes, UUIDs, base64, "password"/"PIN"/"key"/"token" as
words, a CSV table, a PEM header), none of which reads as high. Each case is timed
``--rounds`` times after a warm-up, one call per sample; p50 and p99 are printed in
microseconds, both wall-clock and the calling thread's CPU time (on a shared machine the
wall-clock p99 mostly measures the scheduler: a call preempted once costs a time slice). The
medians are the figure to quote.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loom.sensitivity import reads_as_high  # noqa: E402

PLAIN = (
    "Thanks, that helps. I looked at the deploy logs again and the worker restarted twice around "
    "14:05, right after the config change went out. The queue drained fine once the new settings "
    "were live, so the retries were probably a red herring. Could you have a look at the alerting "
    "rules before Thursday? I'd also like to move the weekly sync to the afternoon, since half "
    "the team is in another time zone now. Merci et bonne soirée ! Bis morgen.\n"
    "2026-12-01T10:22:31Z INFO worker started queue=default concurrency=4\n"
)
NEAR_MISS = (
    "Order 4532015112830366 shipped on 2026-05-01; tracking 1Z999AA10123456784, call +1 415 555 0132. "
    "Commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed request 123e4567-e89b-12d3-a456-426614174000. "
    "Reset your password and PIN before 2027; the PIN must be 4 digits; pin numpy to 1.26.4. "
    "password = os.environ['DB_PASSWORD'] and api_key: <your-api-key>, token=${TOKEN}. "
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 "
    '"integrity": "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg==" '
    "order_id,amount,date\n4111111111111111,19.99,2026-01-02\nPostleitzahl 10115, el código postal es 28013. "
    "Account SID AC0123456789abcdef0123456789abcdef. -----BEGIN PUBLIC KEY----- IBAN DE89 3704 0044 0532 0130 00 "
    "v2.14.3 build 8812 at 12/31/2026 17:00; PIN codes were introduced in 1967. max_tokens=4096 secret_name='prod'\n"
)


def _turn(source: str, size: int) -> str:
    return (source * (size // len(source) + 2))[:size]


def quality(corpus: Path) -> dict[str, dict[str, float]]:
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"high": 0, "hit": 0, "plain": 0, "fp": 0})
    wrong: dict[str, list[int]] = defaultdict(list)
    with corpus.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            row = json.loads(line)
            got = reads_as_high(row["text"])
            cell = per[row["kind"]]
            if row["label"] == "high":
                cell["high"] += 1
                cell["hit"] += got
                if not got:
                    wrong[row["kind"]].append(lineno)
            else:
                cell["plain"] += 1
                cell["fp"] += got
                if got:
                    wrong[row["kind"]].append(lineno)
    total = {"high": 0, "hit": 0, "plain": 0, "fp": 0}
    out: dict[str, dict[str, float]] = {}
    print(f"quality on {os.path.relpath(corpus.resolve(), ROOT)}")
    print(f"  {'kind':<18} {'high':>5} {'recall':>7} {'plain':>6} {'FPR':>6}  lines wrong")
    for kind in sorted(per, key=lambda k: (per[k]["high"] == 0, k)):
        c = per[kind]
        for key in total:
            total[key] += c[key]
        recall = c["hit"] / c["high"] if c["high"] else float("nan")
        fpr = c["fp"] / c["plain"] if c["plain"] else float("nan")
        out[kind] = {**c, "recall": recall, "fpr": fpr}
        r = f"{recall:7.3f}" if c["high"] else f"{'—':>7}"
        p = f"{fpr:6.3f}" if c["plain"] else f"{'—':>6}"
        print(f"  {kind:<18} {c['high']:>5} {r} {c['plain']:>6} {p}  {wrong.get(kind, [])[:12] or ''}")
    recall = total["hit"] / total["high"]
    fpr = total["fp"] / total["plain"]
    out["all"] = {**total, "recall": recall, "fpr": fpr}
    print(f"  {'ALL':<18} {total['high']:>5} {recall:7.3f} {total['plain']:>6} {fpr:6.3f}")
    return out


def _pcts(label: str, samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        f"{label}_p50_us": statistics.median(samples),
        f"{label}_p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
    }


def _time(fn: Callable[[str], bool], text: str, rounds: int) -> dict[str, float]:
    for _ in range(200):
        fn(text)
    wall, cpu = [], []
    for _ in range(rounds):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        fn(text)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        wall.append((t1 - t0) / 1000)
        cpu.append((c1 - c0) / 1000)
    return {**_pcts("wall", wall), **_pcts("cpu", cpu)}


def _load_baseline(path: Path) -> Callable[[str], bool]:
    spec = importlib.util.spec_from_file_location("baseline_sensitivity", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn: Callable[[str], bool] = module.reads_as_high
    return fn


def cost(rounds: int, baseline: Path | None) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    base_fn = _load_baseline(baseline) if baseline else None
    print(
        f"cost per call (one call per sample, {rounds} samples after 200 warm-up calls; wall and thread CPU time)"
    )
    if base_fn:
        print(
            f"  baseline: {baseline} timed on the same texts, in turn, in this run (ratio = cpu p50 new / baseline)"
        )
    for name, source in (("plain", PLAIN), ("near_miss", NEAR_MISS)):
        for size in (200, 2000):
            text = _turn(source, size)
            assert not reads_as_high(text), f"the {name} turn must read as plain"
            fig: dict[str, float] = {"chars": size, **_time(reads_as_high, text, rounds)}
            line = (
                f"  {name:<10} {size:>5} chars: wall p50 {fig['wall_p50_us']:7.1f} p99 {fig['wall_p99_us']:8.1f} us"
                f"   cpu p50 {fig['cpu_p50_us']:7.1f} p99 {fig['cpu_p99_us']:8.1f} us"
            )
            if base_fn:
                base = _time(base_fn, text, rounds)
                fig.update({f"baseline_{k}": v for k, v in base.items()})
                fig["ratio_cpu_p50"] = fig["cpu_p50_us"] / base["cpu_p50_us"]
                line += f"   baseline cpu p50 {base['cpu_p50_us']:7.1f} p99 {base['cpu_p99_us']:8.1f} us"
                line += f"   ratio {fig['ratio_cpu_p50']:.2f}"
            out[f"{name}_{size}"] = fig
            print(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests/data/sensitivity_corpus.jsonl")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here too")
    ap.add_argument(
        "--baseline", type=Path, default=None, help="another sensitivity.py to time on the same texts"
    )
    args = ap.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"sensitivity bench (load avg {load}, {os.cpu_count()} cores, Python {sys.version.split()[0]})")
    figures = {"quality": quality(args.corpus), "cost": cost(args.rounds, args.baseline), "loadavg": load}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
        path = args.out / f"{stamp}-sensitivity.json"
        path.write_text(json.dumps(figures, indent=1, default=str) + "\n")
        print(f"results: {path}")


if __name__ == "__main__":
    main()
