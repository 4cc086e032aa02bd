"""Every insert goes through loom.store.rows.Table.insert; its clickhouse_connect insert
context (and the rows it holds) is freed as soon as the insert returned, not left to the
cyclic collector (which long-running processes run seldom: loom.gc_tuning)."""

from __future__ import annotations

import gc
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
