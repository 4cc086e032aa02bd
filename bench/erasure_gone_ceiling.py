"""How long "gone from disk" must take for one user's rows in a vector table, by part size.

Run: ``.venv/bin/python -m bench.erasure_gone_ceiling [--sizes 25000,100000,250000] [--users-per 1000]``

erasure.request hides a user's rows at once (lightweight DELETE) and the removal job
then rewrites the parts that held them (``ALTER TABLE ... DELETE``, mutations_sync=2):
that is when the rows are gone from disk. A rewritten part of a table with an HNSW
index (conversation_vectors_384: vector_similarity over the whole part) rebuilds the
index of every surviving row, so "gone" is bounded below by the index build of the
part holding the user. This measures, on the embedded engine, the rewrite of one
user's rows (1,000 rows) out of one merged part of N rows: with the table's HNSW index,
and without it (the same rows, the index dropped), and the same N split into 16
partitions by the user's hash (each rewrite touches one partition's part). Issue 19's
target is "gone" <= 5 s for one user of a 1M-turn namespace.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from clickhouse_connect.driver.client import Client

from loom.embedded.clickhouse_endpoint import start_endpoint
from loom.store.clickhouse import connect

DDL = """
CREATE TABLE {name}
(
    namespace LowCardinality(String),
    user_id String,
    thread_id String,
    msg_id String,
    version UInt64,
    embedding Array(BFloat16) CODEC(NONE)
    {index}
)
ENGINE = ReplacingMergeTree(version)
{partition}
ORDER BY (namespace, thread_id, msg_id)
SETTINGS index_granularity = 64
"""
HNSW = ", INDEX ann embedding TYPE vector_similarity('hnsw', 'cosineDistance', 384, 'bf16', 16, 0) GRANULARITY 100000000"
FILL = """
INSERT INTO {name}
SELECT 'ns', concat('u', toString(number % {users})), concat('t', toString(number % {users}), '-', toString(intDiv(number, 50))),
       toString(number), 1, arrayMap(i -> toBFloat16(randNormal(0, 1, i)), range(384))
FROM numbers({n})
"""


def timed(client: Client, sql: str, **settings: int) -> float:
    t0 = time.perf_counter()
    client.command(sql, settings=settings or None)
    return time.perf_counter() - t0


def variant(
    client: Client, name: str, n: int, users: int, index: bool, partitions: int
) -> tuple[float, float]:
    """(seconds to build the merged part(s), seconds to rewrite one user's rows out)."""
    client.command(f"DROP TABLE IF EXISTS {name} SYNC")
    part = f"PARTITION BY cityHash64(user_id) % {partitions}" if partitions > 1 else ""
    client.command(DDL.format(name=name, index=HNSW if index else "", partition=part))
    client.command(FILL.format(name=name, users=users, n=n), settings={"max_insert_threads": 2})
    build = timed(client, f"OPTIMIZE TABLE {name} FINAL")
    gone = timed(client, f"ALTER TABLE {name} DELETE WHERE user_id = 'u7'", mutations_sync=2)
    left = client.command(f"SELECT count() FROM {name} WHERE user_id = 'u7'")
    assert int(str(left)) == 0, left
    client.command(f"DROP TABLE {name} SYNC")
    return build, gone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="25000,100000,250000")
    ap.add_argument("--users-per", type=int, default=1000, help="rows per user")
    args = ap.parse_args()
    print(
        f"# bench/erasure_gone_ceiling.py {vars(args)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"load average at start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="loom-gone-") as home:
        endpoint = start_endpoint(Path(home) / "clickhouse")
        try:
            client = connect(endpoint.url, database="default")
            client.timeout = 3600  # type: ignore[attr-defined]  # an OPTIMIZE of a large vector part outlasts the default
            print(f"{'rows':>9} {'variant':<22} {'build s':>9} {'gone s':>8}  rows rebuilt/s")
            for n in (int(x) for x in args.sizes.split(",")):
                users = max(1, n // args.users_per)
                for label, index, parts in (
                    ("hnsw, one part", True, 1),
                    ("no index", False, 1),
                    ("hnsw, 16 partitions", True, 16),
                ):
                    build, gone = variant(client, "gone_probe", n, users, index, parts)
                    rebuilt = max(0.0, n / parts - args.users_per) / gone  # rows the rewrite kept
                    print(f"{n:>9} {label:<22} {build:>9.2f} {gone:>8.2f}  {rebuilt:>10.0f}", flush=True)
        finally:
            endpoint.stop()
    print(f"load average at end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
