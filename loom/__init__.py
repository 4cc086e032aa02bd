"""Loom: the memory store for AI agents. The client is `from loom import Agent` (the SDK,
loom.sdk); the server is `loom serve` (loom.cli)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.sdk.agent import Agent, Session
    from loom.sdk.sync import SyncAgent
    from loom.sdk.transport import LoomError

__all__ = ["Agent", "LoomError", "Session", "SyncAgent"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the server imports `loom.*` modules and never needs the client.
    if name in ("Agent", "Session"):
        from loom.sdk import agent

        return getattr(agent, name)
    if name == "SyncAgent":
        from loom.sdk.sync import SyncAgent

        return SyncAgent
    if name == "LoomError":
        from loom.sdk.transport import LoomError

        return LoomError
    raise AttributeError(f"module 'loom' has no attribute {name!r}")
