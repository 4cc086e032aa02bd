"""Routes of the webhook ops (admin; tokens bound to one user or session are refused)."""

from __future__ import annotations

from loom.api.deps import Caller, Svc, op_router
from loom.models import webhook as w
from loom.models.errors import error_responses
from loom.ops.webhooks import registry

router = op_router("webhooks")


@router.post("/webhook.register", response_model=w.WebhookRegisterResponse)
async def register(body: w.WebhookRegisterRequest, who: Caller, svc: Svc) -> w.WebhookRegisterResponse:
    """Register a URL for some events of the namespace. The namespace's first registration
    answers its signing secret (this once); see docs/webhooks.md to verify deliveries."""
    got = await registry.register(svc, who, body.namespace, body.url, body.events)
    return w.WebhookRegisterResponse.model_validate(got, from_attributes=True)


@router.post("/webhook.list", response_model=w.WebhookListResponse)
async def list_webhooks(body: w.WebhookListRequest, who: Caller, svc: Svc) -> w.WebhookListResponse:
    """The namespace's webhooks (never the secret)."""
    hooks = await registry.list_webhooks(svc, who, body.namespace)
    # WebhookOut's fields only: never the secret
    return w.WebhookListResponse.model_validate({"webhooks": hooks}, from_attributes=True)


@router.post("/webhook.delete", response_model=w.WebhookDeleteResponse, responses=error_responses(404))
async def delete(body: w.WebhookDeleteRequest, who: Caller, svc: Svc) -> w.WebhookDeleteResponse:
    """Delete a webhook; its queued deliveries are dropped."""
    hook = await registry.delete(svc, who, body.namespace, body.webhook_id)
    return w.WebhookDeleteResponse(webhook_id=hook.webhook_id, deleted=True)


@router.post("/webhook.rotate_secret", response_model=w.WebhookRotateResponse)
async def rotate_secret(body: w.WebhookRotateRequest, who: Caller, svc: Svc) -> w.WebhookRotateResponse:
    """A new signing secret for the namespace (shown this once); deliveries sign with it
    from now on, attempts already queued included."""
    return w.WebhookRotateResponse(secret=await registry.rotate_secret(svc, who, body.namespace))


@router.post("/webhook.deliveries", response_model=w.WebhookDeliveriesResponse)
async def deliveries(body: w.WebhookDeliveriesRequest, who: Caller, svc: Svc) -> w.WebhookDeliveriesResponse:
    """The delivery log, newest attempt first: event, webhook, attempt, status code,
    error code, outcome, times (never the body)."""
    rows = await registry.deliveries(svc, who, body)
    return w.WebhookDeliveriesResponse.model_validate({"deliveries": rows}, from_attributes=True)
