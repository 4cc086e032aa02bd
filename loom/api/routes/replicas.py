"""Routes of the deploy: its live replicas and what they share."""

from __future__ import annotations

from fastapi import APIRouter

from loom.api.deps import Caller, Svc
from loom.models.errors import COMMON, error_responses
from loom.models.replicas import ReplicaOut, ReplicasShowRequest, ReplicasShowResponse
from loom.ops.platform import deploy as ops

router = APIRouter(prefix="/v1", tags=["ops"], responses=error_responses(*COMMON))


@router.post("/replicas.show", response_model=ReplicasShowResponse)
async def show(body: ReplicasShowRequest, who: Caller, svc: Svc) -> ReplicasShowResponse:
    """The capabilities every live API and worker process shares (saving is paused while
    one lacks `saved_state_preserved_in_compaction`), and, for an admin, the replicas."""
    view = await ops.show(svc, who)
    listed = None
    if view.replicas is not None:
        listed = [
            ReplicaOut(
                replica_id=r.replica_id,
                kind=r.kind,
                build=r.build,
                schema_version=r.schema,
                capabilities=list(r.capabilities),
                host=r.host,
                pid=r.pid,
                started_at=r.started_at,
                seen_at=r.seen_at,
            )
            for r in view.replicas
        ]
    return ReplicasShowResponse(capabilities=view.capabilities, live=view.live, replicas=listed)
