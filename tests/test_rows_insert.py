"""Every insert goes through loom.store.rows.Table.insert; its clickhouse_connect insert
context (and the rows it holds) is freed as soon as the insert returned, not left to the
cyclic collector (which long-running processes run seldom: loom.gc_tuning)."""

from __future__ import annotations

import gc
import subprocess
import sys
from datetime import UTC, datetime

from clickhouse_connect.driver.insert import InsertContext

from loom.clock import next_version
from loom.store import conversations as conv_store


def _contexts() -> int:
    return sum(isinstance(o, InsertContext) for o in gc.get_objects())


async def test_no_insert_context_outlives_its_insert(services, ns):
    gc.collect()
    before = _contexts()
    gc.disable()
    try:
        for i in range(20):
            turn = conv_store.Turn(
                ns, "default", "t", f"m{i}", datetime.now(UTC), "tool", f"row {i}", version=next_version()
            )
            conv_store.insert(services.ch, [turn])
        assert _contexts() == before
    finally:
        gc.enable()


def test_an_insert_imports_no_pandas(settings):
    """clickhouse-connect asks whether inserted data is a DataFrame by importing pandas
    (0.9 s, and 68 MB that `loom serve` then kept); loom.store.clickhouse tells it not to."""
    code = (
        "import sys\n"
        "from loom.store.clickhouse import connect\n"
        f"ch = connect({settings.clickhouse_url!r}, database='default')\n"
        "ch.command('CREATE TABLE IF NOT EXISTS pandas_probe (n UInt8) ENGINE = Null')\n"
        "ch.insert('pandas_probe', [[1]], column_names=['n'])\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
