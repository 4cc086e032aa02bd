"""The arq job functions. Each is thin: it unpacks its arguments and calls an op."""

from __future__ import annotations

from typing import Any


async def ping(ctx: dict[str, Any]) -> str:
    """Used by health checks and tests: proves a worker is consuming the queue."""
    return "pong"


FUNCTIONS: list[Any] = [ping]
