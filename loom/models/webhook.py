"""Requests and responses of the webhook ops (webhook.*; admin)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from loom.models.common import NamespacedRequest, PageSize, Timestamp

EventName = Literal["memory.extracted", "conversation.compacted", "erasure.completed"]


class WebhookRegisterRequest(NamespacedRequest):
    url: str = Field(
        min_length=1, max_length=2_048, description="Where events are POSTed: http or https, no credentials."
    )
    events: list[str] | None = Field(
        None,
        max_length=3,
        description="The events it receives (memory.extracted, conversation.compacted, "
        "erasure.completed); all of them when left out.",
    )


class WebhookOut(BaseModel):
    webhook_id: str
    url: str
    events: list[EventName]
    created_at: Timestamp | None = None


class WebhookRegisterResponse(BaseModel):
    webhook: WebhookOut
    secret: str | None = Field(
        description="The namespace's signing secret, answered only by the registration that "
        "created it (the namespace's first); null afterwards (webhook.rotate_secret makes a new one)."
    )


class WebhookListRequest(NamespacedRequest):
    pass


class WebhookListResponse(BaseModel):
    webhooks: list[WebhookOut]


class WebhookDeleteRequest(NamespacedRequest):
    webhook_id: str = Field(min_length=1, max_length=64)


class WebhookDeleteResponse(BaseModel):
    webhook_id: str
    deleted: bool


class WebhookRotateRequest(NamespacedRequest):
    pass


class WebhookRotateResponse(BaseModel):
    secret: str = Field(description="The namespace's new signing secret (shown this once).")


class WebhookDeliveriesRequest(NamespacedRequest):
    webhook_id: str | None = Field(None, min_length=1, max_length=64)
    event_id: str | None = Field(None, min_length=1, max_length=64)
    limit: PageSize = 50


class DeliveryOut(BaseModel):
    webhook_id: str
    event_id: str
    event: EventName
    attempt: int
    status_code: int = Field(description="The receiver's HTTP status (0: no answer).")
    error: str = Field(
        description="'' when delivered; else http_status, redirect, timeout, connect_failed, "
        "webhook_gone, no_secret or internal_error."
    )
    outcome: Literal["delivered", "retrying", "gave_up", "dropped"]
    event_at: Timestamp
    attempted_at: Timestamp
    duration_ms: int
    next_attempt_at: Timestamp | None = None


class WebhookDeliveriesResponse(BaseModel):
    deliveries: list[DeliveryOut]
