"""What every job gets in ctx['loom']: the worker process's services."""

from __future__ import annotations

from typing import Any

from loom.services import Services


def services(ctx: dict[str, Any]) -> Services:
    return ctx["loom"]  # type: ignore[no-any-return]
