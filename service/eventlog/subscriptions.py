"""Who is told about which events: the server's webhooks (``RAYDOCK_WEBHOOKS``) and each
job's (``notify`` in its spec, stored at submit with a secret made for it).

A subscription's id names it in the delivery log: ``server:<name>`` or ``<job id>-<n>``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.schemas.eventlog import MAX_WEBHOOK_URL, EventType, NotifySpec, WebhookPublic
from service.db.eventlog_models import WebhookRow
from service.eventlog.url_policy import check_url
from service.settings import Settings

ALL = "*"


class ServerWebhook(BaseModel):
    """One entry of RAYDOCK_WEBHOOKS."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,48}$")
    url: str = Field(min_length=8, max_length=MAX_WEBHOOK_URL)
    events: list[EventType | Literal["*"]] = Field(default_factory=lambda: [ALL], min_length=1)
    secret: str = Field(min_length=16, max_length=128)


@dataclass(frozen=True)
class Subscription:
    id: str
    url: str
    events: frozenset[str]
    secret: str
    job_id: str | None = None  # None: a server webhook (every job's events and the server's)

    def wants(self, event_type: str) -> bool:
        return ALL in self.events or event_type in self.events

    @property
    def owner(self) -> str:
        """Whose posts these are: the job's (one post of a job is under way at a time),
        or the server webhook's own."""
        return self.job_id or self.id


def server_webhooks(settings: Settings) -> list[Subscription]:
    """The server's webhooks; a bad RAYDOCK_WEBHOOKS stops the server at start, saying why."""
    if not settings.webhooks.webhooks_raw.strip():
        return []
    try:
        entries = TypeAdapter(list[ServerWebhook]).validate_json(settings.webhooks.webhooks_raw)
    except ValidationError as exc:
        raise SystemExit(f"RAYDOCK_WEBHOOKS is invalid: {exc}") from None
    if len({e.name for e in entries}) != len(entries):
        raise SystemExit("RAYDOCK_WEBHOOKS: each webhook needs its own name")
    for e in entries:
        check_url(e.url, allow_private=settings.webhooks.webhook_allow_private, where=f"RAYDOCK_WEBHOOKS[{e.name}].url")
    return [Subscription(f"server:{e.name}", e.url, frozenset(e.events), e.secret) for e in entries]


def check_notify(notify: list[NotifySpec], settings: Settings) -> None:
    """A job's webhooks meet the URL policy (422 ``webhook_url_refused`` otherwise)."""
    for i, n in enumerate(notify):
        check_url(n.url, allow_private=settings.webhooks.webhook_allow_private, where=f"notify.{i}.url")


def add_job_webhooks(s: Session, job_id: str, notify: list[NotifySpec]) -> None:
    for i, n in enumerate(notify, start=1):
        secret = "whsec_" + secrets.token_urlsafe(24)
        s.add(WebhookRow(id=f"{job_id}-{i}", job_id=job_id, url=n.url, events=list(n.events), secret=secret))


def job_subscriptions(s: Session, job_ids: set[str]) -> dict[str, list[Subscription]]:
    out: dict[str, list[Subscription]] = {}
    if not job_ids:
        return out
    for row in s.scalars(select(WebhookRow).where(WebhookRow.job_id.in_(sorted(job_ids)))):
        out.setdefault(row.job_id, []).append(_sub(row))
    return out


def by_id(s: Session, subscription: str, server: list[Subscription]) -> Subscription | None:
    for sub in server:
        if sub.id == subscription:
            return sub
    row = s.get(WebhookRow, subscription)
    return _sub(row) if row is not None else None


def job_webhooks(s: Session, job_id: str, *, with_secrets: bool) -> list[WebhookPublic]:
    """A job's webhooks; their signing secrets only ``with_secrets`` (for those who may
    change the job: a secret lets its holder forge the job's posts)."""
    rows = s.scalars(select(WebhookRow).where(WebhookRow.job_id == job_id).order_by(WebhookRow.id))
    return [WebhookPublic(id=r.id, url=r.url, events=r.events, secret=r.secret if with_secrets else None) for r in rows]


def public(sub: Subscription) -> WebhookPublic:
    return WebhookPublic(id=sub.id, url=sub.url, events=sorted(sub.events))


def _sub(row: WebhookRow) -> Subscription:
    return Subscription(row.id, row.url, frozenset(row.events), row.secret, row.job_id)
