"""The raydock Python SDK.

    from api.client import Client
    client = Client("http://127.0.0.1:8000")
    job = client.submit({"name": "digits", "model": {"type": "mlp"}, "epochs": 5})
    for point in job.stream_metrics():
        print(point.metrics)
    job.wait()

Needs only httpx and pydantic. Server errors are raised as the classes of
``api.errors`` (e.g. ``CapacityExceeded``), carrying the server's code and message.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from api import archives
from api.code_upload import CodeUpload, Progress, upload_code, with_uploaded_code
from api.errors import Busy, RaydockError, error_from_body, retry_after_s
from api.pipelines_client import PipelinesClient
from api.schedules_client import SchedulesClient
from api.schemas import (
    MAX_CANCEL_IDS,
    BestTrialPublic,
    CancelledJobs,
    CheckpointPublic,
    ClusterInfo,
    CodePackagePublic,
    ExploitPublic,
    JobList,
    JobPublic,
    JobSpec,
    JobStatus,
    MetricPoint,
    QuotaPublic,
    QuotaSpec,
    TrainSpec,
    TrialMetricPoint,
    TrialPublic,
    UsagePublic,
    WorkerGroupPublic,
    parse_job_spec,
)
from api.schemas.eventlog import DeliveryList, EventList, EventPublic, WebhookPublic
from api.tenancy_client import TenancyClient

DOWNLOAD_PIECE = 1 << 20  # bytes of a download written at a time


def raise_for_error(r: httpx.Response) -> httpx.Response:
    """The response, or the server's error raised as its ``api.errors`` class (a 429's
    ``Busy`` carries the Retry-After seconds)."""
    if r.status_code < 400:
        return r
    r.read()
    try:
        body = r.json()
    except ValueError:
        body = r.text
    err = error_from_body(r.status_code, body)
    if isinstance(err, Busy):
        err.retry_after_s = retry_after_s(r.headers)
    raise err


class Client(TenancyClient, SchedulesClient, PipelinesClient):
    def __init__(self, url: str = "http://127.0.0.1:8000", token: str | None = None, timeout: float = 30.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.last_upload: CodeUpload | None = None  # what the last submit uploaded, if it had a working_dir

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ http

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return raise_for_error(self.http.request(method, path, **kwargs))

    # ------------------------------------------------------------------ jobs

    def submit(
        self,
        spec: JobSpec | dict[str, Any],
        idempotency_key: str | None = None,
        *,
        base_dir: str | Path | None = None,
        progress: Progress | None = None,
    ) -> "Job":
        """Submit a job. A dict is validated locally first, so typos fail before the network.
        With ``idempotency_key``, a retried submit returns the job the first one created.
        A user-code spec's ``working_dir`` is a directory on this machine (relative to
        ``base_dir``, default the current directory): it is uploaded once (``upload_code``)
        and the job names the package; ``self.last_upload`` says what was sent."""
        if isinstance(spec, dict):
            spec = parse_job_spec(spec)
        spec, self.last_upload = with_uploaded_code(self, spec, base_dir, progress)
        body = spec.model_dump(mode="json", exclude_unset=False)
        for part in (body, body.get("base") or {}):  # unset: the server picks (and a server without projects takes it)
            if part.get("project", "") is None:
                del part["project"]
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return Job(self, JobPublic.model_validate(self.request("POST", "/v1/jobs", json=body, headers=headers).json()))

    def upload_code(
        self,
        directory: str | Path,
        excludes: list[str] | None = None,
        progress: Progress | None = None,
        project: str | None = None,
    ) -> CodeUpload:
        """Package ``directory`` (deterministic zip, .gitignore-style ``excludes`` and the
        default ones) and upload it unless the server has it; ``progress(phase, done,
        total)`` sees the files packed and the bytes sent. The job spec names it as
        ``code: <upload.ref>``; ``project`` holds it (None: the caller's default project)."""
        return upload_code(self, directory, excludes, progress, project)

    def code_package(self, sha256: str, project: str | None = None) -> CodePackagePublic:
        params = {"project": project} if project else {}
        return CodePackagePublic.model_validate(self.request("GET", f"/v1/code/{sha256}", params=params).json())

    def job(self, job_id: str) -> "Job":
        return Job(self, JobPublic.model_validate(self.request("GET", f"/v1/jobs/{job_id}").json()))

    def list(
        self,
        status: JobStatus | str | None = None,
        labels: dict[str, str] | None = None,
        limit: int = 50,
        offset: int = 0,
        cursor: str | None = None,
    ) -> JobList:
        """One page, newest first; pass a page's ``next`` as ``cursor`` for the one after it."""
        params: dict[str, Any] = {
            "limit": limit,
            "offset": offset,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()],
        }
        if status:
            params["status"] = JobStatus(status).value
        if cursor:
            params["cursor"] = cursor
        return JobList.model_validate(self.request("GET", "/v1/jobs", params=params).json())

    def iter_jobs(
        self, status: JobStatus | str | None = None, labels: dict[str, str] | None = None, page_size: int = 200
    ) -> Iterator[JobPublic]:
        """Every matching job, newest first, page by page (following each page's cursor)."""
        cursor = None
        while True:
            page = self.list(status=status, labels=labels, limit=page_size, cursor=cursor)
            yield from page.items
            if page.next is None:
                return
            cursor = page.next

    def cancel_many(self, job_ids: list[str]) -> CancelledJobs:
        """Cancel many jobs, 1000 per request; what was cancelled and what was refused (and why)."""
        out = CancelledJobs(cancelled=[], refused=[])
        for start in range(0, len(job_ids), MAX_CANCEL_IDS):
            page = CancelledJobs.model_validate(
                self.request("POST", "/v1/jobs:cancel", json={"ids": job_ids[start : start + MAX_CANCEL_IDS]}).json()
            )
            out.cancelled += page.cancelled
            out.refused += page.refused
        return out

    def replay(self, job_id: str) -> TrainSpec:
        """A finished search's best trial as a ``kind: train`` spec with the ``schedule`` of
        values it trained with (PBT's lineage); ``client.submit(spec)`` reproduces the trial."""
        return TrainSpec.model_validate(self.request("GET", f"/v1/jobs/{job_id}/best/replay").json())

    def cluster(self) -> ClusterInfo:
        return ClusterInfo.model_validate(self.request("GET", "/v1/cluster").json())

    # ------------------------------------------------------------------ quotas and usage

    def quota(self, project: str) -> QuotaPublic:
        """A project's quota, with what it uses now and its decayed recent usage."""
        return QuotaPublic.model_validate(self.request("GET", f"/v1/projects/{project}/quota").json())

    def set_quota(self, project: str, quota: QuotaSpec) -> QuotaPublic:
        """Set a project's whole quota (fields left out: no limit, or a guarantee of 0)."""
        body = quota.model_dump(mode="json")
        return QuotaPublic.model_validate(self.request("PUT", f"/v1/projects/{project}/quota", json=body).json())

    def usage(self, *, since: Any = None, until: Any = None, project: str | None = None) -> UsagePublic:
        """CPU- and GPU-seconds by project within [since, until] (datetimes or ISO strings)."""
        params = {
            k: (v.isoformat() if hasattr(v, "isoformat") else v)
            for k, v in {"since": since, "until": until, "project": project}.items()
            if v is not None
        }
        return UsagePublic.model_validate(self.request("GET", "/v1/usage", params=params).json())

    # ------------------------------------------------------------------ the event log

    def events(self, *, job: str | None = None, type: str | None = None, since: int = 0, limit: int = 100) -> EventList:
        """One page of the event log, oldest first from ``since`` (pass a page's ``next``)."""
        params = {k: v for k, v in {"job": job, "type": type, "since": since, "limit": limit}.items() if v is not None}
        return EventList.model_validate(self.request("GET", "/v1/events", params=params).json())

    def webhooks(self) -> list[WebhookPublic]:
        """The server's webhooks (without their secrets); server admins only."""
        return [WebhookPublic.model_validate(w) for w in self.request("GET", "/v1/webhooks").json()]

    def deliveries(self, subscription: str, *, before: int | None = None, limit: int = 100) -> DeliveryList:
        """A webhook subscription's deliveries, newest first."""
        params = {"limit": limit, **({"before": before} if before is not None else {})}
        r = self.request("GET", f"/v1/webhooks/{subscription}/deliveries", params=params)
        return DeliveryList.model_validate(r.json())


class Job:
    """A handle on one job; ``info`` is the last state fetched from the server."""

    def __init__(self, client: Client, info: JobPublic):
        self.client, self.info = client, info

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, status={self.status.value})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def status(self) -> JobStatus:
        return self.info.status

    def refresh(self) -> "Job":
        self.info = JobPublic.model_validate(self.client.request("GET", f"/v1/jobs/{self.id}").json())
        return self

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> "Job":
        """Block until the job ends; raises TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().status.is_terminal():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.status.value} after {timeout:g}s")
            time.sleep(poll)
        return self

    def cancel(self) -> "Job":
        self.info = JobPublic.model_validate(self.client.request("POST", f"/v1/jobs/{self.id}/cancel").json())
        return self

    def resume(self) -> "Job":
        """Start a new attempt of a FAILED or CANCELLED job from its last checkpoint."""
        self.info = JobPublic.model_validate(self.client.request("POST", f"/v1/jobs/{self.id}/resume").json())
        return self

    def delete(self) -> None:
        self.client.request("DELETE", f"/v1/jobs/{self.id}")

    def events(self, type: str | None = None, since: int = 0) -> list[EventPublic]:
        """Every event of the job (who submitted, cancelled... it; each status change), oldest first."""
        out: list[EventPublic] = []
        while True:
            params = {"since": since, "limit": 1000, **({"type": type} if type else {})}
            page = EventList.model_validate(
                self.client.request("GET", f"/v1/jobs/{self.id}/events", params=params).json()
            )
            out += page.items
            if page.next is None:
                return out
            since = page.next

    def webhooks(self) -> list[WebhookPublic]:
        """The job's webhooks (its spec's ``notify``) with the secret each post is signed with
        (``None`` for a viewer of the job's project)."""
        return [
            WebhookPublic.model_validate(w) for w in self.client.request("GET", f"/v1/jobs/{self.id}/webhooks").json()
        ]

    def metrics(self, since: int = -1, *, max_points: int | None = None, page_size: int = 1000) -> list[MetricPoint]:
        """Every report with seq > since, fetched page by page; with ``max_points`` the
        series downsampled for a chart (each point the last report of a bucket, with the
        bucket's ``metrics_min`` / ``metrics_max``)."""
        if max_points is not None:
            data = self.client.request(
                "GET", f"/v1/jobs/{self.id}/metrics", params={"since": since, "max_points": max_points}
            ).json()
            return [MetricPoint.model_validate(m) for m in data]
        return list(self.iter_metrics(since, page_size=page_size))

    def iter_metrics(self, since: int = -1, *, page_size: int = 1000) -> Iterator[MetricPoint]:
        """The stored reports with seq > since, one page per request, following the
        server's ``Link: rel=next``."""
        params: dict[str, Any] | None = {"since": since, "limit": page_size}
        url = f"/v1/jobs/{self.id}/metrics"
        while url:
            r = self.client.request("GET", url, params=params)
            for m in r.json():
                yield MetricPoint.model_validate(m)
            url, params = r.links.get("next", {}).get("url"), None

    def stream_metrics(self, since: int = -1) -> Iterator[MetricPoint]:
        """Yield each report as the server receives it, until the job ends."""
        with self.client.http.stream(
            "GET", f"/v1/jobs/{self.id}/metrics/stream", params={"since": since}, timeout=None
        ) as r:
            raise_for_error(r)
            event = None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event == "metric":
                    yield MetricPoint.model_validate(json.loads(line.split(":", 1)[1]))
                elif line.startswith("data:") and event == "end":
                    return

    def logs(self, follow: bool = False) -> str | Iterator[str]:
        """The whole log as a string, or with ``follow=True`` an iterator of new text."""
        if not follow:
            return self.client.request("GET", f"/v1/jobs/{self.id}/logs").text
        return self._follow_logs()

    def _follow_logs(self) -> Iterator[str]:
        with self.client.http.stream("GET", f"/v1/jobs/{self.id}/logs", params={"follow": True}, timeout=None) as r:
            raise_for_error(r)
            yield from r.iter_text()

    def worker_groups(self) -> list[WorkerGroupPublic]:
        """Each start of the job's workers (first, resize, restart): world size and nodes."""
        data = self.client.request("GET", f"/v1/jobs/{self.id}/worker-groups").json()
        return [WorkerGroupPublic.model_validate(g) for g in data]

    # --- a search's trials (kind: tune jobs)

    def trials(self) -> list[TrialPublic]:
        """A search's trials: status, values, last and best metric, exploits."""
        data = self.client.request("GET", f"/v1/jobs/{self.id}/trials").json()
        return [TrialPublic.model_validate(t) for t in data]

    def trial_metrics(self, trial_id: str, since: int = -1) -> list[TrialMetricPoint]:
        data = self.client.request(
            "GET", f"/v1/jobs/{self.id}/trials/{trial_id}/metrics", params={"since": since}
        ).json()
        return [TrialMetricPoint.model_validate(m) for m in data]

    def lineage(self) -> list[ExploitPublic]:
        """PBT's exploits in order: who cloned whom, when, with which new values."""
        data = self.client.request("GET", f"/v1/jobs/{self.id}/lineage").json()
        return [ExploitPublic.model_validate(e) for e in data]

    def best(self) -> BestTrialPublic:
        """The best trial and its values; with its checkpoint once the search ended."""
        return BestTrialPublic.model_validate(self.client.request("GET", f"/v1/jobs/{self.id}/best").json())

    # --- end of a search's trials

    def checkpoints(self) -> list[CheckpointPublic]:
        data = self.client.request("GET", f"/v1/jobs/{self.id}/checkpoints").json()
        return [CheckpointPublic.model_validate(c) for c in data]

    def download_checkpoint(self, checkpoint: CheckpointPublic | int | None = None, dest: str | Path = ".") -> Path:
        """Download a checkpoint (the latest by default) and unpack it into ``dest``/<job>-<id>/."""
        if checkpoint is None:
            found = self.checkpoints()
            if not found:
                raise RaydockError(f"job {self.id} has no checkpoints", code="no_checkpoints", status=404)
            checkpoint = found[-1]
        cid = checkpoint if isinstance(checkpoint, int) else checkpoint.id
        return self._unpack(f"/v1/jobs/{self.id}/checkpoints/{cid}/download", Path(dest) / f"{self.id}-{cid}")

    def download_tensorboard(self, dest: str | Path = ".") -> Path:
        """Download the job's TensorBoard event files (spec ``tracking.tensorboard``) into
        ``dest``/<job>-tensorboard/, for ``tensorboard --logdir`` there."""
        return self._unpack(f"/v1/jobs/{self.id}/tensorboard", Path(dest) / f"{self.id}-tensorboard")

    def _unpack(self, path: str, target: Path) -> Path:
        """A tar.gz the server streams, unpacked into ``target``: written to disk as it
        arrives, then unpacked from there, so memory stays flat whatever the size."""
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target) as archive:
            with self.client.http.stream("GET", path, timeout=None) as r:
                raise_for_error(r)
                for piece in r.iter_bytes(DOWNLOAD_PIECE):
                    archive.write(piece)
            archive.seek(0)
            with tarfile.open(fileobj=archive, mode="r:gz") as tar:
                archives.extract(tar, target)  # the data filter, or the same checks where tarfile lacks it
        return target
