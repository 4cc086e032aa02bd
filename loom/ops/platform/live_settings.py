"""Live settings: the few settings an admin may change while Loom runs, and how every
process follows the change.

The environment (loom.settings) gives each one's default; an override stored with
settings.set (or the dashboard) wins. Every process keeps the environment's Settings as
its baseline (``Services.base_settings``) and runs a :class:`Follower`: it polls a
version number in Redis about every second (settings.set bumps it after its write) and,
when it moved (or every REFRESH_S anyway: a Redis restarted loses the number), re-reads
the stored overrides and replaces ``Services.settings`` with a copy carrying them. Every
op reads ``svc.settings`` per call, so a change is in force in every API and worker
process within about a second, without a restart.

An override a process cannot validate (a value a newer build allows, a setting it does
not know) is skipped with a warning, never applied and never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import TypeAdapter, ValidationError

from loom import failures, redis_keys
from loom import logging as loom_logging
from loom.services import Services, Slot
from loom.settings import Settings
from loom.store import settings_overrides as store

log = loom_logging.get("loom.settings")

POLL_S = 1.0  # between reads of the version number (one GET)
REFRESH_S = 30.0  # the overrides are re-read this often even when the number did not move
APPLIED_TTL_S = 3 * REFRESH_S  # a process's report outlives two missed refreshes
VERSION_KEY = redis_keys.SETTINGS_VERSION
FOLLOWER = "loom.live_settings"  # the key of a process's Follower in Services.extras
_FOLLOWER: Slot[Follower] = Slot(FOLLOWER)

# Field name -> what it does (the dashboard's help text). Exactly these are live: every
# setting of the conversation plane's table, in four groups (GROUPS). Secrets (API keys,
# passwords) and where the backends are are never live, and never shown.
LIVE_SETTINGS: dict[str, str] = {
    "conversation_search_min_similarity": (
        "conversation.search leaves out hits whose similarity to the query is below this (-1 to 1)."
    ),
    "conversation_search_excerpt_chars": "How many characters of a turn a search hit's excerpt shows.",
    "conversation_titler_enabled": "Whether the titler gives untitled threads a short LLM-written title.",
    "conversation_titler_interval_seconds": "How often a titler pass runs (seconds).",
    "conversation_titler_window_hours": "A titler pass covers threads active within this many hours.",
    "conversation_titler_min_turns": "A thread is titled once it has at least this many live turns.",
    "conversation_titler_max_threads_per_pass": "The most threads one titler pass titles.",
    "retention_conversations_days": (
        "Days a transcript turn is kept (0: forever). Applied to the tables' TTL at once; "
        "shortening it deletes older turns, so it must be confirmed."
    ),
    "tiering_conversations_warm_days": (
        "Days after which transcript parts move to the 'warm' volume (0: never; only where the "
        "storage policy has one)."
    ),
    "session_brief_llm": "Whether a model revises session briefs from their events.",
    "session_brief_llm_model": "The model that revises briefs (empty: the LLM provider's own).",
    "session_brief_window_chars": "How many characters of events one brief revision reads.",
    "session_brief_max_windows": "The most windows of events one brief save reads (older ones drop).",
    "mcp_session_run_idle_seconds": "An MCP session's implicit run closes after this long without a call.",
}
# Field name -> the short name a person knows it by (the dashboard's label; the LOOM_
# variable is shown beside it).
LABELS: dict[str, str] = {
    "conversation_search_min_similarity": "Search: minimum similarity",
    "conversation_search_excerpt_chars": "Search: excerpt length",
    "conversation_titler_enabled": "Titler",
    "conversation_titler_interval_seconds": "Titler: how often",
    "conversation_titler_window_hours": "Titler: window",
    "conversation_titler_min_turns": "Titler: minimum turns",
    "conversation_titler_max_threads_per_pass": "Titler: threads per pass",
    "retention_conversations_days": "Transcript retention",
    "tiering_conversations_warm_days": "Move to warm storage after",
    "session_brief_llm": "Briefs: revised by a model",
    "session_brief_llm_model": "Briefs: model",
    "session_brief_window_chars": "Briefs: window size",
    "session_brief_max_windows": "Briefs: most windows per save",
    "mcp_session_run_idle_seconds": "MCP: run idle timeout",
}
CONVERSATIONS, RETENTION, CONTEXT, MCP = "Conversations", "Retention and storage tiering", "Context", "Mcp"
GROUPS: dict[str, str] = {
    "retention_conversations_days": RETENTION,
    "tiering_conversations_warm_days": RETENTION,
    "session_brief_llm": CONTEXT,
    "session_brief_llm_model": CONTEXT,
    "session_brief_window_chars": CONTEXT,
    "session_brief_max_windows": CONTEXT,
    "mcp_session_run_idle_seconds": MCP,
}
# Changing these rewrites the conversation tables' TTL (loom.ops.platform.settings.update).
STORAGE_RULES = ("retention_conversations_days", "tiering_conversations_warm_days")


def group(field: str) -> str:
    return GROUPS.get(field, CONVERSATIONS)


def env_name(field: str) -> str:
    return f"LOOM_{field.upper()}"


def field_of(name: str) -> str | None:
    """The Settings field a LOOM_ name names (spelled exactly so), when it is a live one."""
    field = name.removeprefix("LOOM_").lower()
    return field if field in LIVE_SETTINGS and env_name(field) == name else None


@cache
def adapter(field: str) -> TypeAdapter[Any]:
    """The field's own type and bounds (as Settings validates it), for one value."""
    info = Settings.model_fields[field]
    kind: Any = info.annotation
    return TypeAdapter(Annotated[(kind, *info.metadata)] if info.metadata else kind)


def validate(field: str, value: Any) -> Any:
    """The value as the setting holds it; pydantic's ValidationError when it breaks the
    field's type or bounds (NaN and infinities fail the bounds every live float has).
    A JSON number or boolean must be of the setting's type (strict: no 1.0 for an int,
    no 1 for a bool); a string is read as the environment's LOOM_ variable would be
    ("240", "true", "0.35": what a form sends)."""
    return adapter(field).validate_python(value, strict=not isinstance(value, str))


@dataclass(frozen=True)
class Bounds:
    kind: str  # "float" | "int" | "bool" | "str"
    min: float | None
    max: float | None


@cache
def bounds(field: str) -> Bounds:
    info = Settings.model_fields[field]
    kinds: dict[Any, str] = {float: "float", int: "int", bool: "bool", str: "str"}
    low: Any = next((m.ge for m in info.metadata if isinstance(m, Ge)), None)  # a number: Settings' bounds
    high: Any = next((m.le for m in info.metadata if isinstance(m, Le)), None)
    return Bounds(kinds[info.annotation], low, high)


def in_force(stored: Mapping[str, store.Override]) -> dict[str, Any]:
    """The stored overrides this build can apply, by field name, validated."""
    out: dict[str, Any] = {}
    for name, row in stored.items():
        if name not in LIVE_SETTINGS:
            log.warning("stored setting override skipped: not a live setting here", setting=name)
            continue
        try:
            out[name] = validate(name, row.value)
        except ValidationError as exc:
            rule = exc.errors()[0]["type"]
            log.warning("stored setting override skipped: invalid here", setting=env_name(name), rule=rule)
    return out


def with_overrides(current: Settings, base: Settings, overrides: Mapping[str, Any]) -> Settings:
    """`current` with every live setting as the override says, else as `base` has it.
    Only the live fields are touched: the rest of `current` stays as it is."""
    update = {name: overrides.get(name, getattr(base, name)) for name in LIVE_SETTINGS}
    return current.model_copy(update=update)


def apply(svc: Services, overrides: Mapping[str, Any]) -> None:
    """Put `overrides` (validated, by field name) in force in this process."""
    svc.settings = with_overrides(svc.settings, svc.base_settings, overrides)
    follower = _FOLLOWER.get(svc)
    if follower is not None:
        follower.applied = dict(overrides)


async def bump(svc: Services) -> None:
    """Tell every process the overrides changed (after the write)."""
    await svc.redis.incr(VERSION_KEY)


@dataclass(kw_only=True, frozen=True)
class ProcessReport:
    """What one process's follower applied last: the version and its overrides."""

    process: str  # "<api|worker>:<host>:<pid>"
    version: int
    overrides: dict[str, Any]  # LOOM_ name -> value


def process_name(kind: str) -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}"


async def reports(svc: Services) -> list[ProcessReport]:
    """Every live process's last report (each expires APPLIED_TTL_S after its last refresh)."""
    keys = sorted([k async for k in svc.redis.scan_iter(match=redis_keys.SETTINGS_APPLIED + "*", count=500)])
    values = await svc.redis.mget(keys) if keys else []
    out = []
    for key, raw in zip(keys, values, strict=True):
        if raw is None:  # expired between the scan and the read
            continue
        body = json.loads(raw)
        name = key.decode().removeprefix(redis_keys.SETTINGS_APPLIED)
        out.append(
            ProcessReport(process=name, version=int(body["version"]), overrides=dict(body["overrides"]))
        )
    return out


class Follower:
    """Keeps ``svc.settings`` as the stored overrides say (see the module docstring).
    With a `process` name, it reports what it applied (settings.get lists the reports:
    which processes have a change in force)."""

    def __init__(
        self, svc: Services, *, process: str = "", poll_s: float = POLL_S, refresh_s: float = REFRESH_S
    ) -> None:
        self.svc = svc
        self.process = process
        self.poll_s, self.refresh_s = poll_s, refresh_s
        self.applied: dict[str, Any] = {}
        self.version: bytes | None = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> bool:
        """Read the overrides and apply them if they changed; True when they did."""
        found = in_force(await self.svc.run(store.live, self.svc.ch))
        if found == self.applied:
            return False
        apply(self.svc, found)
        self.applied = found
        log.info("live settings applied", overrides=sorted(env_name(n) for n in found))
        return True

    async def _sync(self, version: bytes | None) -> None:
        """Refresh for `version` (read before the overrides: a write after the read
        moves the number again, so it is never missed) and report it."""
        await self.refresh()
        self.version = version
        if self.process:
            body = {
                "version": int(version or 0),
                "overrides": {env_name(k): v for k, v in self.applied.items()},
            }
            key = redis_keys.settings_applied(self.process)
            await self.svc.redis.set(key, json.dumps(body), ex=int(APPLIED_TTL_S))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        failed = 0  # failures in a row: the retries back off up to refresh_s
        while True:
            await asyncio.sleep(min(self.poll_s * 2 ** min(failed, 10), self.refresh_s))
            try:
                version = await self.svc.redis.get(VERSION_KEY)
                if version != self.version or loop.time() - last >= self.refresh_s:
                    await self._sync(version)
                    last = loop.time()
                failed = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a backend away: said, and tried again
                failed += 1
                log.warning("live settings not refreshed; retrying", error=failures.detail(exc))

    async def start(self) -> None:
        """Apply what is stored now (best effort), then follow in the background."""
        try:
            await self._sync(await self.svc.redis.get(VERSION_KEY))
        except Exception as exc:  # the loop tries again
            self.version = b"?"  # not a version: the loop's first read differs
            log.warning("live settings not read at start; retrying", error=failures.detail(exc))
        self._task = asyncio.create_task(self._run(), name="loom-live-settings")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.process:
            with contextlib.suppress(Exception):  # gone anyway within APPLIED_TTL_S
                await self.svc.redis.delete(redis_keys.settings_applied(self.process))


async def follow(svc: Services, kind: str) -> Follower:
    """Start this process's follower (`kind`: "api" from the API's lifespan, "worker"
    from the worker's start-up)."""
    follower = Follower(svc, process=process_name(kind))
    await follower.start()
    _FOLLOWER.put(svc, follower)
    return follower


async def unfollow(svc: Services) -> None:
    follower = _FOLLOWER.take(svc)
    if follower is not None:
        await follower.stop()
