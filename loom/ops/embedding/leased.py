"""A background pass held under a Redis lease kept renewed while it runs (the recovery
pass and an import's embedding): one place for the keeper's start and teardown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from loom.leases import Lease, LeaseLost, keep_renewed


@contextlib.asynccontextmanager
async def kept_renewed(lease: Lease, name: str) -> AsyncIterator[asyncio.Task[None]]:
    """Run the body with `lease` (already acquired) renewed by a keeper task, which it
    gets to check (done: the lease was lost); the keeper is stopped and the lease
    released however the body ends (a failed release only lets the lease expire)."""
    keeper = asyncio.get_running_loop().create_task(keep_renewed(lease), name=name)
    try:
        yield keeper
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await keeper
        with contextlib.suppress(Exception):
            await lease.release()
