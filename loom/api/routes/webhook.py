"""Routes of the webhook ops (admin; tokens bound to one user or session are refused)."""

from __future__ import annotations

from loom.api.deps import Caller, Svc, op_router
from loom.models.errors import error_responses
from loom.models.webhook import (
    WebhookDeleteRequest,
    WebhookDeleteResponse,
    WebhookDeliveriesRequest,
    WebhookDeliveriesResponse,
    WebhookListRequest,
    WebhookListResponse,
    WebhookRegisterRequest,
    WebhookRegisterResponse,
    WebhookRotateRequest,
    WebhookRotateResponse,
)
from loom.ops.webhooks import registry

router = op_router("webhooks")


@router.post("/webhook.register", response_model=WebhookRegisterResponse)
async def register(body: WebhookRegisterRequest, who: Caller, svc: Svc) -> WebhookRegisterResponse:
    """Register a URL for some events of the namespace. The namespace's first registration
    answers its signing secret (this once); see docs/webhooks.md to verify deliveries."""
    got = await registry.register(svc, who, body.namespace, body.url, body.events)
    return WebhookRegisterResponse.model_validate(got, from_attributes=True)


@router.post("/webhook.list", response_model=WebhookListResponse)
async def list_webhooks(body: WebhookListRequest, who: Caller, svc: Svc) -> WebhookListResponse:
    """The namespace's webhooks (never the secret)."""
    hooks = await registry.list_webhooks(svc, who, body.namespace)
    # WebhookOut's fields only: never the secret
    return WebhookListResponse.model_validate({"webhooks": hooks}, from_attributes=True)


@router.post("/webhook.delete", response_model=WebhookDeleteResponse, responses=error_responses(404))
async def delete(body: WebhookDeleteRequest, who: Caller, svc: Svc) -> WebhookDeleteResponse:
    """Delete a webhook; its queued deliveries are dropped."""
    hook = await registry.delete(svc, who, body.namespace, body.webhook_id)
    return WebhookDeleteResponse(webhook_id=hook.webhook_id, deleted=True)


@router.post("/webhook.rotate_secret", response_model=WebhookRotateResponse)
async def rotate_secret(body: WebhookRotateRequest, who: Caller, svc: Svc) -> WebhookRotateResponse:
    """A new signing secret for the namespace (shown this once); deliveries sign with it
    from now on, attempts already queued included."""
    return WebhookRotateResponse(secret=await registry.rotate_secret(svc, who, body.namespace))


@router.post("/webhook.deliveries", response_model=WebhookDeliveriesResponse)
async def deliveries(body: WebhookDeliveriesRequest, who: Caller, svc: Svc) -> WebhookDeliveriesResponse:
    """The delivery log, newest attempt first: event, webhook, attempt, status code,
    error code, outcome, times (never the body)."""
    rows = await registry.deliveries(
        svc, who, body.namespace, webhook_id=body.webhook_id, event_id=body.event_id, limit=body.limit
    )
    return WebhookDeliveriesResponse.model_validate({"deliveries": rows}, from_attributes=True)
