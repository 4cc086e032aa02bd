"""settings.get and settings.set: the live settings (Knowledge -> Conversations on the
dashboard), read and changed by an admin whose token is not bound to one user.

Settings are the server's, not a namespace's: a token bound to one user or session
(an end user's) may neither see nor change them. A change is checked whole before
anything is written (every value with its setting's own type and bounds): one bad
value and nothing is stored. It is in force in the calling process at once and in every
other within about a second (loom.ops.platform.live_settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from clickhouse_schema import runner
from loom.auth.principal import Principal, Role
from loom.clock import utcnow
from loom.errors import Forbidden, InvalidRequest
from loom.ops.platform import live_settings as live
from loom.services import Services
from loom.store import settings_overrides as store


@dataclass(kw_only=True, frozen=True)
class SettingView:
    """One live setting as settings.get shows it."""

    name: str  # LOOM_...
    label: str  # what a person calls it (live_settings.LABELS)
    value: Any  # in force: the override, else the default
    default: Any  # what the environment (or Loom's built-in default) gives
    source: str  # "default" | "environment" | "override"
    type: str  # "float" | "int" | "bool" | "str"
    group: str  # Conversations | Retention and storage tiering | Context | Mcp
    description: str
    min: float | None = None
    max: float | None = None
    updated_at: datetime | None = None
    updated_by: str = ""


@dataclass(kw_only=True, frozen=True)
class SettingsReport:
    """settings.get's answer: the settings, the current version of the overrides, and
    what each running process (API, worker) applied last."""

    settings: list[SettingView]
    version: int
    processes: list[live.ProcessReport]
    changes: list[store.Change]  # the audit trail, newest first


def _allowed(who: Principal) -> None:
    who.require_role(Role.admin)
    if who.bounded:
        raise Forbidden(
            "a token bound to one user or session cannot see or change settings", rule="read_scope"
        )


def _views(svc: Services, stored: Mapping[str, store.Override]) -> list[SettingView]:
    base = svc.base_settings
    overrides = live.in_force(stored)
    views = []
    for field, description in live.LIVE_SETTINGS.items():
        default = getattr(base, field)
        bounds = live.bounds(field)
        row = stored.get(field) if field in overrides else None
        source = "override" if row else ("environment" if field in base.model_fields_set else "default")
        views.append(
            SettingView(
                name=live.env_name(field),
                label=live.LABELS[field],
                value=overrides.get(field, default),
                default=default,
                source=source,
                type=bounds.kind,
                group=live.group(field),
                description=description,
                min=bounds.min,
                max=bounds.max,
                updated_at=row.updated_at if row else None,
                updated_by=row.updated_by if row else "",
            )
        )
    return views


CHANGES_SHOWN = 50


async def _report(svc: Services, stored: Mapping[str, store.Override]) -> SettingsReport:
    version = int(await svc.redis.get(live.VERSION_KEY) or 0)
    changes = await svc.run(store.recent_changes, svc.ch, CHANGES_SHOWN)
    return SettingsReport(
        settings=_views(svc, stored), version=version, processes=await live.reports(svc), changes=changes
    )


async def show(svc: Services, who: Principal) -> SettingsReport:
    """settings.get (admin, unbounded): every live setting, where its value comes from.
    Read from the store, so the answer is what every process applies (or will within
    a second), whichever process answers; `processes` says which have."""
    _allowed(who)
    return await _report(svc, await svc.run(store.live, svc.ch))


def _checked(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every value validated, by field name (None stays None: clear the override)."""
    if not values:
        raise InvalidRequest("values names no setting", field="values", rule="empty")
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = live.field_of(name)
        if field is None:
            allowed = ", ".join(live.env_name(f) for f in live.LIVE_SETTINGS)
            raise InvalidRequest(
                f"{name[:100]} is not a live setting (one of: {allowed})",
                field=f"values.{name[:100]}",
                rule="unknown_setting",
            )
        if value is None:
            out[field] = None
            continue
        try:
            out[field] = live.validate(field, value)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidRequest(
                f"{name}: {first['msg']}", field=f"values.{name}", rule=first["type"]
            ) from None
    return out


def _in_force(svc: Services, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every live setting's value with `overrides` in force (the environment's otherwise)."""
    return {f: overrides.get(f, getattr(svc.base_settings, f)) for f in live.LIVE_SETTINGS}


def _confirmed(before: Mapping[str, Any], after: Mapping[str, Any], confirm: bool) -> None:
    """Shortening retention deletes the turns older than the new limit at the next merge:
    it needs the caller's confirmation (the dashboard asks for it)."""
    old, new = before["retention_conversations_days"], after["retention_conversations_days"]
    shorter = new > 0 and (old == 0 or new < old)
    if shorter and not confirm:
        raise InvalidRequest(
            f"shortening transcript retention to {new} days deletes every older turn; "
            "send confirm_shorter_retention: true to do it",
            field="confirm_shorter_retention",
            rule="required_to_shorten_retention",
        )


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], token_id: str) -> list[store.Change]:
    now = utcnow()
    return [
        store.Change(
            changed_at=now,
            name=live.env_name(f),
            old_value=before[f],
            new_value=after[f],
            changed_by=token_id,
        )
        for f in live.LIVE_SETTINGS
        if before[f] != after[f]
    ]


async def update(
    svc: Services, who: Principal, values: Mapping[str, Any], *, confirm_shorter_retention: bool = False
) -> SettingsReport:
    """settings.set (admin, unbounded): {"LOOM_NAME": value or None}; None clears the
    override (the environment's value applies again). All or nothing: every value is
    checked, and a shorter retention confirmed, before anything is written. A retention or
    tiering change is applied to the tables' TTL at once; every change is audited."""
    _allowed(who)
    checked = _checked(values)
    stored = await svc.run(store.live, svc.ch)
    current = live.in_force(stored)
    before = _in_force(svc, current)
    # A cleared override (None) leaves the environment's value in force.
    after = _in_force(svc, {k: v for k, v in {**current, **checked}.items() if v is not None})
    _confirmed(before, after, confirm_shorter_retention)
    await svc.run(store.write, svc.ch, checked, who.token_id)
    await svc.run(store.record, svc.ch, _changes(before, after, who.token_id))
    if any(before[f] != after[f] for f in live.STORAGE_RULES):
        await svc.run(_apply_storage_rules, svc, after)
    await live.bump(svc)
    stored = await svc.run(store.live, svc.ch)
    # In force here at once; the other processes follow the version just bumped.
    live.apply(svc, live.in_force(stored))
    return await _report(svc, stored)


def _apply_storage_rules(svc: Services, values: Mapping[str, Any]) -> None:
    runner.apply_storage_rules(
        svc.ch,
        values["retention_conversations_days"],
        values["tiering_conversations_warm_days"],
        svc.settings.clickhouse_cluster,
    )
