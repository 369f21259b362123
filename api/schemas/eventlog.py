"""The event log and its webhooks, as the API shows them and a job spec asks for them:
one logged event (``EventPublic``, also the webhook payload), a page of them, a job's
``notify`` entry, a subscription and its deliveries."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from api.schemas.common import Strict
from api.schemas.jobs import UtcDatetime

EventType = Literal[
    "submitted",
    "admitted",
    "started",
    "status_changed",
    "retried",
    "resized",
    "checkpointed",
    "cancelled",
    "resumed",
    "preempted",
    "quota_set",
    "deleted",
    "code_uploaded",
    "retention_sweep",
    "user_created",
    "user_deleted",
    "token_created",
    "token_revoked",
    "project_created",
    "member_set",
    "member_removed",
    "schedule_created",
    "schedule_paused",
    "schedule_resumed",
    "schedule_deleted",
    "schedule_fired",
    "schedule_skipped",
    "pipeline_submitted",
    "pipeline_cancelled",
    "pipeline_resumed",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)
PAYLOAD_VERSION = 1
MAX_NOTIFY = 5  # webhooks per job
MAX_WEBHOOK_URL = 2048
# The headers of a webhook post (``Raydock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``).
SIGNATURE_HEADER = "Raydock-Signature"
EVENT_ID_HEADER = "Raydock-Event-Id"
EVENT_TYPE_HEADER = "Raydock-Event-Type"
DELIVERY_HEADER = "Raydock-Delivery"


class NotifySpec(Strict):
    """A webhook of one job: its events are posted to ``url``, signed with a secret the
    server makes (read it from GET /v1/jobs/{id}/webhooks)."""

    url: str = Field(
        min_length=8,
        max_length=MAX_WEBHOOK_URL,
        pattern=r"^[^\x00-\x20\x7f]+$",  # no spaces or control characters (a NUL cannot be stored)
        description="http(s) URL the events are posted to; it must resolve to a public address unless the server allows others.",
    )
    events: list[EventType | Literal["*"]] = Field(
        default_factory=lambda: ["status_changed"],
        min_length=1,
        max_length=len(EVENT_TYPES) + 1,
        description='Event types to post; ["*"] for all of the job\'s events.',
    )


class EventPublic(BaseModel):
    """One event of the log; a webhook posts exactly this, as JSON."""

    version: int = Field(default=PAYLOAD_VERSION, description="Payload version; fields are only ever added within one.")
    id: int = Field(description="The event's id: it only grows, and is the `since` cursor of GET /v1/events.")
    type: str = Field(description="What happened: " + ", ".join(EVENT_TYPES) + ".")
    at: UtcDatetime
    job_id: str | None = Field(default=None, description="The job it happened to; null for an event of the server.")
    actor: str = Field(description="Who did it: `system` (the server itself), `api-token`, or `loopback`.")
    data: dict[str, Any] = Field(default_factory=dict, description="Details of the type, e.g. from, to, reason, cause.")


class EventList(BaseModel):
    items: list[EventPublic]
    next: int | None = Field(
        default=None, description="Pass as `since` for the next page; null when this page reached the newest event."
    )


class WebhookPublic(BaseModel):
    id: str = Field(description="The subscription id (`server:<name>` or `<job id>-<n>`).")
    url: str
    events: list[str]
    secret: str | None = Field(
        default=None,
        description="The signing secret of a job's webhook, for those who may change the job (never of the server's).",
    )


class DeliveryPublic(BaseModel):
    id: int
    event_id: int
    state: Literal["pending", "delivered", "failed"]
    attempts: int = Field(description="Posts tried so far.")
    next_at: UtcDatetime | None = Field(default=None, description="When a pending delivery is tried next.")
    last_status: int | None = Field(default=None, description="The receiver's last HTTP status (null: no answer).")
    last_error: str | None = None
    last_duration_s: float | None = None
    created_at: UtcDatetime
    delivered_at: UtcDatetime | None = None


class DeliveryList(BaseModel):
    subscription: str
    items: list[DeliveryPublic]
    next: int | None = Field(default=None, description="Pass as `before` for older deliveries; null at the oldest.")
