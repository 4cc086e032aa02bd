"""SQL of loom.webhooks, loom.webhook_secrets and loom.webhook_deliveries (migration 018).

A registration or secret change is a new version (ReplacingMergeTree); reads take the
newest (FINAL). The delivery log is append-only, one row per attempt, newest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from clickhouse_connect.driver.client import Client

from loom.clock import next_version
from loom.store.rows import VERSION, column, frozen_table_row, table_row
from loom.store.rows import table as declare_table


@table_row
class Webhook:
    """A row of loom.webhooks (its ``version`` is the writer's)."""

    namespace: str = column("LowCardinality(String)")
    webhook_id: str = column("String")
    url: str = column("String")
    events: list[str] = column("Array(String)")
    created_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    created_by: str = column("String", default="")
    deleted: bool = column("Bool", default=False)


WEBHOOKS = declare_table("webhooks", Webhook, extra=[VERSION])


@frozen_table_row
class Secret:
    """A row of loom.webhook_secrets: the namespace's signing secret."""

    namespace: str = column("LowCardinality(String)")
    secret: str = column("String")
    created_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    created_by: str = column("String", default="")


SECRETS = declare_table("webhook_secrets", Secret, extra=[VERSION])


@frozen_table_row
class Delivery:
    """A row of loom.webhook_deliveries: one attempt to deliver one event to one webhook."""

    namespace: str = column("LowCardinality(String)")
    webhook_id: str = column("String")
    event_id: str = column("String")
    event: str = column("LowCardinality(String)")
    attempt: int = column("UInt16")
    status_code: int = column("UInt16")
    error: str = column("LowCardinality(String)")
    outcome: str = column("LowCardinality(String)")
    event_at: datetime = column("DateTime64(3, 'UTC')")
    attempted_at: datetime = column("DateTime64(3, 'UTC')")
    duration_ms: int = column("UInt32")
    next_attempt_at: datetime | None = column("Nullable(DateTime64(3, 'UTC'))", default=None)


DELIVERIES = declare_table("webhook_deliveries", Delivery)


def save(ch: Client, hook: Webhook) -> None:
    WEBHOOKS.insert(ch, [hook], version=next_version())


def live(ch: Client, namespace: str) -> list[Webhook]:
    """The namespace's registered webhooks, oldest first."""
    return WEBHOOKS.select(
        ch,
        "WHERE namespace = {ns:String} AND NOT deleted ORDER BY created_at, webhook_id",
        {"ns": namespace},
    )


def get(ch: Client, namespace: str, webhook_id: str) -> Webhook | None:
    """One live webhook of the namespace, or None."""
    return WEBHOOKS.first(
        ch,
        "WHERE namespace = {ns:String} AND webhook_id = {id:String} AND NOT deleted",
        {"ns": namespace, "id": webhook_id},
    )


def save_secret(ch: Client, secret: Secret) -> None:
    SECRETS.insert(ch, [secret], version=next_version())


def secret(ch: Client, namespace: str) -> str | None:
    """The namespace's current signing secret, or None before its first registration."""
    found = SECRETS.first(ch, "WHERE namespace = {ns:String}", {"ns": namespace})
    return found.secret if found is not None else None


def record(ch: Client, rows: Sequence[Delivery]) -> None:
    if rows:
        DELIVERIES.insert(ch, rows)


def deliveries(
    ch: Client, namespace: str, *, webhook_id: str | None, event_id: str | None, limit: int
) -> list[Delivery]:
    """The namespace's attempts, newest first (optionally of one webhook or one event)."""
    where = ["namespace = {ns:String}"]
    params: dict[str, object] = {"ns": namespace, "lim": limit}
    if webhook_id:
        where.append("webhook_id = {wh:String}")
        params["wh"] = webhook_id
    if event_id:
        where.append("event_id = {ev:String}")
        params["ev"] = event_id
    return DELIVERIES.select(
        ch,
        f"WHERE {' AND '.join(where)} ORDER BY attempted_at DESC, attempt DESC LIMIT {{lim:UInt32}}",
        params,
        final=False,
    )
