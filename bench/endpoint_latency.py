"""Median `SELECT 1` latency: chdb in-process vs the embedded ClickHouse endpoint.

    .venv/bin/python bench/endpoint_latency.py [--runs 2000]

Three ways over the endpoint, so the adapter's own cost is visible apart from the
client library's: raw HTTP on a keep-alive connection, and clickhouse-connect's
query() and command() (what Loom uses). chdb direct runs on a separate data
directory (one engine per path), in this process.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ["TZ"] = "UTC"  # as the endpoint runs its engine
time.tzset()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loom.embedded.clickhouse_endpoint import start_endpoint  # noqa: E402


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 200) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()

    import chdb
    import clickhouse_connect

    with tempfile.TemporaryDirectory(prefix="loom-bench-") as tmp:
        direct = chdb.connect(f"file:{Path(tmp) / 'direct'}")
        results = {
            "chdb in-process, direct": median_ms(lambda: direct.query("SELECT 1", "TabSeparated"), args.runs)
        }
        direct.close()

        endpoint = start_endpoint(Path(tmp) / "endpoint")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", endpoint.port)

            def raw() -> bytes:
                conn.request("POST", "/", body=b"SELECT 1")
                return conn.getresponse().read()

            results["endpoint, raw HTTP keep-alive"] = median_ms(raw, args.runs)
            client = clickhouse_connect.get_client(
                host="127.0.0.1", port=endpoint.port, compress="lz4", autogenerate_session_id=False
            )
            results["endpoint, clickhouse-connect query()"] = median_ms(
                lambda: client.query("SELECT 1"), args.runs
            )
            results["endpoint, clickhouse-connect command()"] = median_ms(
                lambda: client.command("SELECT 1"), args.runs
            )
            client.close()
            conn.close()
        finally:
            endpoint.stop()

    base = results["chdb in-process, direct"]
    print(f"SELECT 1, median of {args.runs} runs")
    for name, ms in results.items():
        extra = "" if name == "chdb in-process, direct" else f"  (+{ms - base:.3f} ms)"
        print(f"  {name:<40} {ms:.3f} ms{extra}")


if __name__ == "__main__":
    main()
