"""Route of health.show (admin; tokens bound to one user or session are refused)."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models.health import HealthShowRequest, HealthShowResponse
from loom.ops.platform import health

router = op_router("ops")


@router.post("/health.show", response_model=HealthShowResponse)
async def health_show(body: HealthShowRequest, who: Caller, svc: Svc) -> HealthShowResponse:
    """The backends, the job queue, the embedding outcomes and the append and search
    rates. A backend that is down is reported (`status: degraded`), not answered with a
    503; only the token's check needs the store."""
    return HealthShowResponse(**asdict(await health.show(svc, who)))
