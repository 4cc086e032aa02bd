"""Routes of settings.get and settings.set (admin; tokens bound to one user or session
are refused): the live settings, in force in every process within seconds."""

from __future__ import annotations

from loom.api.deps import Caller, Svc, op_router
from loom.models import settings as st
from loom.ops.platform import settings as ops

router = op_router("settings")


@router.post("/settings.get", response_model=st.SettingsResponse)
async def settings_get(body: st.SettingsGetRequest, who: Caller, svc: Svc) -> st.SettingsResponse:
    """Every live setting: the value in force, the default, and where it comes from
    (`default`, `environment` or `override`)."""
    return st.SettingsResponse.model_validate(await ops.show(svc, who), from_attributes=True)


@router.post("/settings.set", response_model=st.SettingsResponse)
async def settings_set(body: st.SettingsSetRequest, who: Caller, svc: Svc) -> st.SettingsResponse:
    """Store overrides (null clears one); every API and worker process applies them
    within a few seconds, without a restart. A retention or tiering change is applied to
    the tables' TTL at once (a shorter retention needs `confirm_shorter_retention`). Every
    change is audited. Answers as settings.get."""
    done = await ops.update(svc, who, body.values, confirm_shorter_retention=body.confirm_shorter_retention)
    return st.SettingsResponse.model_validate(done, from_attributes=True)
