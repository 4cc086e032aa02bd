"""Routes of the deploy: its live replicas and what they share."""

from __future__ import annotations

from loom.api.deps import Caller, Svc, op_router
from loom.models.replicas import ReplicasShowRequest, ReplicasShowResponse
from loom.ops.platform import deploy as ops

router = op_router("ops")


@router.post("/replicas.show", response_model=ReplicasShowResponse)
async def show(body: ReplicasShowRequest, who: Caller, svc: Svc) -> ReplicasShowResponse:
    """The capabilities every live API and worker process shares (saving is paused while
    one lacks `saved_state_preserved_in_compaction`), and, for an admin, the replicas."""
    return ReplicasShowResponse.model_validate(await ops.show(svc, who), from_attributes=True)
