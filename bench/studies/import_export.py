"""Question: How fast do `loom import` (a ChatGPT export) and `loom export` go, and how far behind
the model's raw rate is the import's background embedding?

    python -m bench.studies.import_export --turns 100000 [--embed-seconds 120]

Result: bench/results/<date>-<time>-import-<turns>.{json,txt} (last:
2026-12-04-1859-import-100k).

Import and export, end to end, as a user runs them: `loom import` of a ChatGPT data
export of N turns into a running `loom serve`, then its background embedding against
the model's raw rate, then `loom export` of the namespace.

1. Writes a ChatGPT-shaped ``conversations.json`` of N turns (conversations of 20 turns of
   ~200 characters, each message a node of the `mapping` tree), streamed to disk.
2. Starts `loom serve` with no worker (nothing embeds while the import is timed: the
   figure is the import's own rate), mints an admin token, turns recording on.
3. Times `loom import FILE --namespace NS` and samples, every second, the resident memory
   of the CLI, the API and the ClickHouse endpoint (flat memory: the file is streamed, one
   conversation at a time).
4. Measures the model's raw rate in this process with the worker's own configuration
   (the ModelBatcher over single-threaded MiniLM), the stack frozen meanwhile; then starts a
   worker and reads the import's embedding progress (import.status) for `--embed-seconds`:
   its rate over that span against the raw rate.
5. Times `loom export --namespace NS --output FILE` (gzip) and reads the rows it wrote.

Prints the figures with the load average before and after, and writes them to
``<out>/<date>-import.txt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.loom_stack import LoomStack  # noqa: E402

_SAMPLE = (
    "the user asked about the deployment pipeline and whether the staging cluster "
    "could be rebuilt before friday because the migration of the billing service "
    "failed twice with a timeout while the database was locked by a long running "
    "report that nobody remembered scheduling last quarter so we agreed to move it"
)
WORDS = _SAMPLE.split()


def make_text(rng: random.Random, chars: int) -> str:
    """Words of the sample sentence, about ``chars`` characters: a turn's text."""
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


TURNS_PER_CONVERSATION = 20
TEXT_CHARS = 200


def write_chatgpt(path: Path, turns: int, seed: int = 42) -> int:
    """A ChatGPT data export of `turns` turns, written one conversation at a time."""
    rng = random.Random(seed)
    start = 1_700_000_000.0
    with path.open("w") as f:
        f.write("[")
        n = conv = 0
        while n < turns:
            k = min(TURNS_PER_CONVERSATION, turns - n)
            cid = f"conv-{conv:07d}"
            mapping: dict[str, Any] = {
                "root": {"id": "root", "message": None, "parent": None, "children": []}
            }
            parent = "root"
            for i in range(k):
                node = f"{cid}-m{i:02d}"
                mapping[parent]["children"] = [node]
                mapping[node] = {
                    "id": node,
                    "message": {
                        "id": node,
                        "author": {
                            "role": "user" if i % 2 == 0 else "assistant",
                            "name": None,
                            "metadata": {},
                        },
                        "create_time": start + n + i,
                        "content": {"content_type": "text", "parts": [make_text(rng, TEXT_CHARS)]},
                        "status": "finished_successfully",
                        "weight": 1.0,
                        "metadata": {"model_slug": "gpt-4o"} if i % 2 else {},
                        "recipient": "all",
                    },
                    "parent": parent,
                    "children": [],
                }
                parent = node
            item = {
                "title": f"Conversation {conv}",
                "create_time": start + n,
                "update_time": start + n + k,
                "mapping": mapping,
                "current_node": parent,
                "conversation_id": cid,
                "id": cid,
            }
            f.write(("," if conv else "") + json.dumps(item))
            n += k
            conv += 1
        f.write("]")
    return conv


def rss_mb(pid: int) -> float:
    try:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    except psutil.Error:
        return 0.0


def _stack_pid(stack: LoomStack, needle: str) -> int | None:
    for pid in stack.pids:
        try:
            if needle in " ".join(psutil.Process(pid).cmdline()):
                return pid
        except psutil.Error:
            continue
    return None


def cpu_s(pid: int | None) -> float:
    try:
        t = psutil.Process(pid).cpu_times() if pid else None
    except psutil.Error:
        return 0.0
    return float(t.user + t.system) if t else 0.0


CPU: dict[str, float] = {}  # CPU seconds each process spent in the last run_sampled


def run_sampled(
    cmd: list[str], env: dict[str, str], watch: dict[str, int | None]
) -> tuple[float, str, dict[str, list[float]]]:
    """Run `cmd`, sampling the RSS of it and of `watch` every second (and their CPU time)."""
    samples: dict[str, list[float]] = {"cli": [], **{k: [] for k in watch}}
    before = {name: cpu_s(pid) for name, pid in watch.items()}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    cli_cpu = 0.0
    while proc.poll() is None:
        samples["cli"].append(rss_mb(proc.pid))
        cli_cpu = max(cli_cpu, cpu_s(proc.pid))
        for name, pid in watch.items():
            if pid:
                samples[name].append(rss_mb(pid))
        time.sleep(0.5)
    CPU.clear()
    CPU.update(
        {"cli (to its last sample)": cli_cpu, **{n: cpu_s(pid) - before[n] for n, pid in watch.items()}}
    )
    out = proc.stdout.read().decode() if proc.stdout else ""
    if proc.returncode:
        raise RuntimeError(f"{cmd[3]} failed ({proc.returncode}): {out[-2000:]}")
    return time.monotonic() - t0, out, samples


def quarters(xs: list[float]) -> str:
    if not xs:
        return "-"
    picks = [xs[min(len(xs) - 1, int(len(xs) * q))] for q in (0.1, 0.25, 0.5, 0.75)] + [xs[-1]]
    return " / ".join(f"{x:.0f}" for x in picks) + f" MB (peak {max(xs):.0f})"


async def raw_model_rate(seconds: float) -> float:
    """Texts/s of the worker's own model configuration (ModelBatcher, single-threaded
    MiniLM calls, one per core) on texts like the import's."""
    import loom.ops.conversation  # noqa: F401  (first: workers.embed_jobs imported alone meets an import cycle)
    from loom.settings import Settings
    from workers.embed_jobs import ModelBatcher, embedder_from_settings, model_parallelism, set_embedder

    set_embedder(embedder_from_settings(Settings(embedder="minilm")))
    batcher = ModelBatcher(parallel=model_parallelism())
    rng = random.Random(7)
    texts = [make_text(rng, TEXT_CHARS) for _ in range(4096)]
    await batcher(texts[:64])  # warm
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(batcher(texts[i : i + 64]) for i in range(0, 1024, 64)))
        done += 1024
    rate = done / (time.perf_counter() - t0)
    await batcher.close()
    return rate


def status(stack: LoomStack, token: str, ns: str) -> dict[str, Any]:
    r = httpx.post(
        f"{stack.base_url}/v1/import.status",
        json={"namespace": ns},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["jobs"][0]  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--turns", type=int, default=100_000)
    ap.add_argument("--embed-seconds", type=float, default=120.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    lines: list[str] = []
    figures: dict[str, Any] = {"turns": args.turns, "cpus": os.cpu_count()}

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    work = Path(tempfile.mkdtemp(prefix="loom-import-bench-"))
    source = work / "conversations.json"
    t0 = time.monotonic()
    conversations = write_chatgpt(source, args.turns)
    size_mb = source.stat().st_size / 2**20
    say(
        f"== loom import / export, {args.turns:,} turns ({conversations:,} conversations, {size_mb:.0f} MB), {os.cpu_count()} CPUs"
    )
    say(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; file written in {time.monotonic() - t0:.0f}s"
    )
    figures["load_before"] = os.getloadavg()

    stack = LoomStack(workers=0, embedder="minilm")
    stack.start(log=say)
    try:
        env = dict(stack.env)
        mint = subprocess.run(
            [
                sys.executable,
                "-m",
                "loom.cli.main",
                "token",
                "mint",
                "--namespace",
                "bench",
                "--role",
                "admin",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        token = mint.stdout.strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {token}"}
        httpx.post(
            f"{stack.base_url}/v1/conversation.set_logging",
            json={"namespace": "bench", "enabled": True},
            headers=headers,
        ).raise_for_status()
        cli_env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        cli_env |= {"LOOM_URL": stack.base_url, "LOOM_TOKEN": token}
        watch = {
            "api": _stack_pid(stack, "loom.api.process"),
            "endpoint": _stack_pid(stack, "clickhouse_endpoint"),
            "redis": _stack_pid(stack, "redis-server"),
        }

        took, out, rss = run_sampled(
            [sys.executable, "-m", "loom.cli.main", "import", str(source), "--namespace", "bench", "--json"],
            cli_env,
            watch,
        )
        summary = json.loads(out.strip().splitlines()[-1])
        stored = summary["counts"].get("stored", 0)
        rate = stored / took
        figures["import"] = {
            "seconds": took,
            "stored": stored,
            "turns_per_s": rate,
            "counts": summary["counts"],
            "rss_mb": rss,
        }
        say(
            f"import: {stored:,} turns stored in {took:.1f}s = {rate:,.0f} turns/s  [goal >= 5,000/s]  counts {summary['counts']}"
        )
        for name, xs in rss.items():
            say(f"  RSS {name:9s} at 10/25/50/75/100% of the import: {quarters(xs)}")
        figures["import"]["cpu_s"] = dict(CPU)
        say("  CPU seconds during the import: " + ", ".join(f"{k} {v:.1f}" for k, v in CPU.items()))

        t1 = time.monotonic()
        export_path = work / "export.ndjson.gz"
        took_x, out_x, rss_x = run_sampled(
            [
                sys.executable,
                "-m",
                "loom.cli.main",
                "export",
                "--namespace",
                "bench",
                "--output",
                str(export_path),
            ],
            cli_env,
            watch,
        )
        rows = int(out_x.split(": ", 1)[1].split(" rows")[0])
        figures["export"] = {
            "seconds": took_x,
            "rows": rows,
            "rows_per_s": rows / took_x,
            "bytes": export_path.stat().st_size,
            "rss_mb": rss_x,
        }
        say(
            f"export: {rows:,} rows in {took_x:.1f}s = {rows / took_x:,.0f} rows/s  [goal >= 20,000/s]  {export_path.stat().st_size / 2**20:.0f} MB gzip"
        )
        say(f"  RSS cli during the export: {quarters(rss_x['cli'])}; api {quarters(rss_x['api'])}")
        del t1

        stack.pause()
        raw = asyncio.run(raw_model_rate(20.0))
        stack.resume()
        figures["raw_model_rate"] = raw
        say(f"raw model rate (the worker's configuration, stack frozen): {raw:,.1f} texts/s")
        worker = subprocess.Popen(
            [sys.executable, "-m", "loom.cli.main", "worker"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            first = status(stack, token, "bench")["embedding"]
            while first["embedded"] == 0 and time.monotonic() < deadline:
                time.sleep(1.0)
                first = status(stack, token, "bench")["embedding"]
            t_a, e_a = time.monotonic(), first["embedded"]
            time.sleep(args.embed_seconds)
            last = status(stack, token, "bench")["embedding"]
            t_b, e_b = time.monotonic(), last["embedded"]
        finally:
            worker.terminate()
            worker.wait(30)
        emb_rate = (e_b - e_a) / (t_b - t_a)
        figures["embedding"] = {
            "rate": emb_rate,
            "ratio": emb_rate / raw,
            "from": e_a,
            "to": e_b,
            "seconds": t_b - t_a,
            "last": last,
        }
        say(
            f"background embedding: {e_b - e_a:,} turns in {t_b - t_a:.0f}s = {emb_rate:,.1f}/s = "
            f"{emb_rate / raw:.2f}x the raw rate  [goal >= 0.9x]  ({e_b:,} of {last['to_embed']:,} done)"
        )
    finally:
        stack.stop()
    figures["load_after"] = os.getloadavg()
    say(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    name = f"{stamp}-import{('-' + args.tag) if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (args.out / f"{name}.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    source.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
