"""Gauges read at scrape time: jobs by status and kind, the queue's depth and the age of
its oldest job, the Ray cluster's CPUs and GPUs (the backend's last answer, never a call
to Ray per scrape), and for RUNNING jobs only their throughput, MFU and step: the only
series with a job id, so they go when the job stops running.

Three indexed reads per scrape, whatever the history holds: a count by status and kind
(``ix_jobs_status_kind``), the queue's size and oldest entry (``ix_jobs_queue``), and the
running jobs (``ix_jobs_status_*``, at most ``MAX_RUNNING`` rows)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from api.schemas import JobStatus
from service.db.models import JobRow

KINDS = ("train", "tune")
MAX_RUNNING = 1000  # running jobs reported one by one; a cluster rarely runs more
THROUGHPUT = {"samples_per_s": "samples", "tokens_per_s": "tokens"}  # metric a loop reports -> unit label


class StoreCollector(Collector):
    def __init__(self, sessions: sessionmaker, backend: Any = None) -> None:
        self.sessions, self.backend = sessions, backend

    def collect(self) -> Iterator[GaugeMetricFamily]:
        started = time.perf_counter()
        with self.sessions() as s:
            by_status = s.execute(
                select(JobRow.status, JobRow.kind, func.count()).group_by(JobRow.status, JobRow.kind)
            ).all()
            depth, oldest = s.execute(
                select(func.count(), func.min(JobRow.queued_at)).where(JobRow.status == JobStatus.QUEUED.value)
            ).one()
            running = s.execute(
                select(JobRow.id, JobRow.latest_metrics)
                .where(JobRow.status == JobStatus.RUNNING.value)
                .order_by(JobRow.created_at.desc(), JobRow.id.desc())
                .limit(MAX_RUNNING)
            ).all()
        yield _jobs(by_status)
        yield GaugeMetricFamily("raydock_queue_depth", "Jobs waiting in the queue (QUEUED).", value=depth or 0)
        age = 0.0
        if oldest is not None:
            oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=timezone.utc)
            age = max((datetime.now(timezone.utc) - oldest).total_seconds(), 0.0)
        yield GaugeMetricFamily(
            "raydock_queue_oldest_age_seconds",
            "How long the longest-waiting queued job has waited (0: none).",
            value=age,
        )
        yield from self._cluster()
        yield from self._warm_pool()
        yield from _running(running)
        yield GaugeMetricFamily(
            "raydock_scrape_store_seconds",
            "Time this scrape spent reading the store.",
            value=time.perf_counter() - started,
        )

    def _cluster(self) -> Iterator[GaugeMetricFamily]:
        last = getattr(self.backend, "last_cluster", None)
        if last is None:
            return
        at, info = last
        cpus = GaugeMetricFamily("raydock_cluster_cpus", "Ray cluster CPUs, by state (total, used).", labels=["state"])
        cpus.add_metric(["total"], info.cpus_total)
        cpus.add_metric(["used"], info.cpus_total - info.cpus_free)
        gpus = GaugeMetricFamily("raydock_cluster_gpus", "Ray cluster GPUs, by state (total, used).", labels=["state"])
        gpus.add_metric(["total"], info.gpus_total)
        gpus.add_metric(["used"], info.gpus_total - info.gpus_free)
        nodes = GaugeMetricFamily(
            "raydock_cluster_nodes_alive", "Ray nodes alive.", value=sum(n.alive for n in info.nodes)
        )
        age = GaugeMetricFamily(
            "raydock_cluster_info_age_seconds",
            "Age of the cluster figures above (the monitor refreshes them every tick).",
            value=time.monotonic() - at,
        )
        yield from (cpus, gpus, nodes, age)

    def _warm_pool(self) -> Iterator[CounterMetricFamily]:
        pool = getattr(self.backend, "pool", None)
        if pool is None:
            return
        yield CounterMetricFamily(
            "raydock_warm_pool_log_reads",
            "Warm-pool actor logs read from the Ray dashboard (one per live node with a pool, per refresh).",
            value=pool.log_reads,
        )
        yield CounterMetricFamily(
            "raydock_warm_pool_log_bytes",
            "Bytes of warm-pool actor logs read from the Ray dashboard (a bounded tail of each).",
            value=pool.log_bytes,
        )


def _jobs(rows) -> GaugeMetricFamily:
    counts = {(status.value, kind): 0 for status in JobStatus for kind in KINDS}
    for status, kind, n in rows:
        counts[(status, kind)] = n
    family = GaugeMetricFamily("raydock_jobs", "Jobs in the store by status and kind.", labels=["status", "kind"])
    for (status, kind), n in sorted(counts.items()):
        family.add_metric([status, kind], n)
    return family


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _running(rows) -> Iterator[GaugeMetricFamily]:
    rate = GaugeMetricFamily(
        "raydock_job_throughput",
        "Latest reported throughput of a RUNNING job, items per second (unit: samples or tokens).",
        labels=["job_id", "unit"],
    )
    mfu = GaugeMetricFamily(
        "raydock_job_mfu", "Latest model FLOPs utilisation of a RUNNING job (0-1).", labels=["job_id"]
    )
    step = GaugeMetricFamily("raydock_job_step", "Latest reported step of a RUNNING job.", labels=["job_id"])
    for job_id, metrics in rows:
        metrics = metrics if isinstance(metrics, dict) else {}
        for key, unit in THROUGHPUT.items():
            if (v := _number(metrics.get(key))) is not None:
                rate.add_metric([job_id, unit], v)
        if (v := _number(metrics.get("mfu"))) is not None:
            mfu.add_metric([job_id], v)
        if (v := _number(metrics.get("step"))) is not None:
            step.add_metric([job_id], v)
    yield from (rate, mfu, step)
