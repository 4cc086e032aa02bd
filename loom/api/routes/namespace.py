"""Routes of the namespace switches."""

from __future__ import annotations

from dataclasses import asdict

from loom.api.deps import Caller, Svc, op_router
from loom.models.namespace import GetConfigRequest, NamespaceConfigResponse, SetPolicyRequest
from loom.ops.platform import namespaces as ops

router = op_router("namespaces")


@router.post("/namespace.get_config", response_model=NamespaceConfigResponse)
async def get_config(body: GetConfigRequest, who: Caller, svc: Svc) -> NamespaceConfigResponse:
    config = await ops.get_config(svc, who, body.namespace)
    return NamespaceConfigResponse(**asdict(config))


@router.post("/namespace.set_policy", response_model=NamespaceConfigResponse)
async def set_policy(body: SetPolicyRequest, who: Caller, svc: Svc) -> NamespaceConfigResponse:
    """The owner's switch for server-side model calls and the operator's extraction policy."""
    config = await ops.set_model_calls(
        svc, who, body.namespace, body.model_calls_enabled, body.extraction_policy
    )
    return NamespaceConfigResponse(**asdict(config))
