"""Route of health.show (admin; tokens bound to one user or session are refused)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from loom.api.deps import Caller, Svc
from loom.models.errors import COMMON, error_responses
from loom.models.health import HealthShowRequest, HealthShowResponse
from loom.ops.platform import health

router = APIRouter(prefix="/v1", tags=["ops"], responses=error_responses(*COMMON))


@router.post("/health.show", response_model=HealthShowResponse)
async def health_show(body: HealthShowRequest, who: Caller, svc: Svc) -> HealthShowResponse:
    """The backends, the job queue, the embedding outcomes and the append and search
    rates. A backend that is down is reported (`status: degraded`), not answered with a
    503; only the token's check needs the store."""
    return HealthShowResponse(**asdict(await health.show(svc, who)))
