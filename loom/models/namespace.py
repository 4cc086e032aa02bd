from __future__ import annotations

from loom.models.common import NamespacedRequest, StrictModel


class NamespaceConfigResponse(StrictModel):
    namespace: str
    conversation_logging_enabled: bool
    model_calls_enabled: bool
    extraction_policy: str


class GetConfigRequest(NamespacedRequest):
    pass


class SetPolicyRequest(NamespacedRequest):
    model_calls_enabled: bool
    extraction_policy: str | None = None
