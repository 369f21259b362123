"""Routes of the event log and its webhooks: the log (all of it, or one job's), a job's
webhooks with their signing secrets, the server's webhooks, and a subscription's
delivery log. Reads only: events are written by what they record."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.errors import admin_only, job_not_found
from api.schemas import INT64_MAX
from api.schemas.eventlog import DeliveryList, EventList, EventType, WebhookPublic
from service.db.models import JobRow
from service.eventlog import deliveries, subscriptions
from service.eventlog import log as eventlog
from service.http.deps import ID_PATTERN, AppSettings, CurrentCaller, JobId, Reads, Store
from service.http.openapi import errors
from service.http.visibility import subscription_visible

router = APIRouter(tags=["events"])

SinceId = Annotated[int, Query(ge=0, le=INT64_MAX, description="Only events with id > since (a page's `next`).")]
Limit = Annotated[int, Query(ge=1, le=1000, description="Most events in the page.")]
TypeFilter = Annotated[EventType | None, Query(description="Only events of this type.")]
SubscriptionId = Annotated[
    str,
    Path(
        pattern=r"^(server:[A-Za-z0-9_.-]{1,48}|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$",
        description="`server:<name>` or `<job id>-<n>` (GET /v1/webhooks, GET /v1/jobs/{job_id}/webhooks).",
    ),
]


@router.get("/events", response_model=EventList, operation_id="list_events", responses=errors(422))
def list_events(
    store: Store,
    caller: CurrentCaller,
    job: Annotated[str | None, Query(pattern=ID_PATTERN, description="Only this job's events.")] = None,
    type: TypeFilter = None,
    since: SinceId = 0,
    limit: Limit = 100,
) -> EventList:
    """The event log, oldest first from `since`: what happened to each job and to the
    server, and who did it; a user who is no server admin sees the events of their
    projects' jobs. Page on with each page's `next` as `since`."""
    with store() as s:
        return eventlog.page(s, job_id=job, type=type, since=since, limit=limit, projects=caller.projects)


@router.get(
    "/jobs/{job_id}/events", response_model=EventList, operation_id="list_job_events", responses=errors(404, 422)
)
def list_job_events(
    store: Store, job_id: JobId, type: TypeFilter = None, since: SinceId = 0, limit: Limit = 100
) -> EventList:
    """One job's events, oldest first (they outlive the job: its deletion is one)."""
    with store() as s:
        found = eventlog.page(s, job_id=job_id, type=type, since=since, limit=limit)
        if not found.items and since == 0 and s.get(JobRow, job_id) is None:
            raise job_not_found(job_id)
    return found


@router.get(
    "/jobs/{job_id}/webhooks",
    response_model=list[WebhookPublic],
    operation_id="list_job_webhooks",
    responses=errors(404, 422),
)
def list_job_webhooks(store: Store, caller: CurrentCaller, job_id: JobId) -> list[WebhookPublic]:
    """The job's webhooks (its spec's `notify`), with the secret each post is signed with
    for those who may change the job (a viewer of its project gets them without)."""
    with store() as s:
        job = s.get(JobRow, job_id)
        if job is None:
            raise job_not_found(job_id)
        return subscriptions.job_webhooks(s, job_id, with_secrets=caller.can_write(job.project))


@router.get("/webhooks", response_model=list[WebhookPublic], operation_id="list_webhooks", responses=errors(403))
def list_webhooks(settings: AppSettings, caller: CurrentCaller) -> list[WebhookPublic]:
    """The server's webhooks (RAYDOCK_WEBHOOKS), without their secrets: server admins only
    (a webhook's URL often carries a credential of its receiver)."""
    if not caller.admin:
        raise admin_only("Listing the server's webhooks")
    return [subscriptions.public(sub) for sub in subscriptions.server_webhooks(settings)]


@router.get(
    "/webhooks/{subscription}/deliveries",
    response_model=DeliveryList,
    operation_id="list_webhook_deliveries",
    responses=errors(422),
)
def list_deliveries(
    store: Store,
    reads: Reads,
    caller: CurrentCaller,
    subscription: SubscriptionId,
    before: Annotated[int | None, Query(ge=1, le=INT64_MAX, description="A page's `next`: older deliveries.")] = None,
    limit: Limit = 100,
) -> DeliveryList:
    """A subscription's deliveries, newest first: state, tries, the receiver's last answer."""
    if not subscription_visible(reads, subscription, caller):
        return DeliveryList(subscription=subscription, items=[])  # as for a subscription with no deliveries
    with store() as s:
        return deliveries.page(s, subscription, before=before, limit=limit)
