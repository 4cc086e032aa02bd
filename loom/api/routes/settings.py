"""Routes of settings.get and settings.set (admin; tokens bound to one user or session
are refused): the live settings, in force in every process within seconds."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models.settings import (
    ChangeOut,
    ProcessOut,
    SettingOut,
    SettingsGetRequest,
    SettingsResponse,
    SettingsSetRequest,
)
from loom.ops.platform import settings as ops
from loom.ops.platform.settings import SettingsReport

router = op_router("settings")


def _answer(report: SettingsReport) -> SettingsResponse:
    return SettingsResponse(
        settings=[SettingOut(**asdict(v)) for v in report.settings],
        version=report.version,
        processes=[ProcessOut(**asdict(p)) for p in report.processes],
        changes=[ChangeOut(**asdict(c)) for c in report.changes],
    )


@router.post("/settings.get", response_model=SettingsResponse)
async def settings_get(body: SettingsGetRequest, who: Caller, svc: Svc) -> SettingsResponse:
    """Every live setting: the value in force, the default, and where it comes from
    (`default`, `environment` or `override`)."""
    return _answer(await ops.show(svc, who))


@router.post("/settings.set", response_model=SettingsResponse)
async def settings_set(body: SettingsSetRequest, who: Caller, svc: Svc) -> SettingsResponse:
    """Store overrides (null clears one); every API and worker process applies them
    within a few seconds, without a restart. A retention or tiering change is applied to
    the tables' TTL at once (a shorter retention needs `confirm_shorter_retention`). Every
    change is audited. Answers as settings.get."""
    done = await ops.update(svc, who, body.values, confirm_shorter_retention=body.confirm_shorter_retention)
    return _answer(done)
