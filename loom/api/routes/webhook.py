"""Routes of the webhook ops (admin; tokens bound to one user or session are refused)."""

from __future__ import annotations

from fastapi import APIRouter

from loom.api.deps import Caller, Svc
from loom.models.errors import COMMON, error_responses
from loom.models.webhook import (
    WebhookDeleteRequest,
    WebhookDeleteResponse,
    WebhookDeliveriesRequest,
    WebhookDeliveriesResponse,
    WebhookListRequest,
    WebhookListResponse,
    WebhookOut,
    WebhookRegisterRequest,
    WebhookRegisterResponse,
    WebhookRotateRequest,
    WebhookRotateResponse,
)
from loom.ops.webhooks import registry
from loom.store.webhooks import Webhook

router = APIRouter(prefix="/v1", tags=["webhooks"], responses=error_responses(*COMMON))


def _out(h: Webhook) -> WebhookOut:
    return WebhookOut.model_validate(h, from_attributes=True)  # its fields only: never the secret


@router.post("/webhook.register", response_model=WebhookRegisterResponse)
async def register(body: WebhookRegisterRequest, who: Caller, svc: Svc) -> WebhookRegisterResponse:
    """Register a URL for some events of the namespace. The namespace's first registration
    answers its signing secret (this once); see docs/webhooks.md to verify deliveries."""
    got = await registry.register(svc, who, body.namespace, body.url, body.events)
    return WebhookRegisterResponse(webhook=_out(got.webhook), secret=got.secret)


@router.post("/webhook.list", response_model=WebhookListResponse)
async def list_webhooks(body: WebhookListRequest, who: Caller, svc: Svc) -> WebhookListResponse:
    """The namespace's webhooks (never the secret)."""
    return WebhookListResponse(
        webhooks=[_out(h) for h in await registry.list_webhooks(svc, who, body.namespace)]
    )


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
    rows = await registry.deliveries(svc, who, body)
    return WebhookDeliveriesResponse.model_validate({"deliveries": rows}, from_attributes=True)
