"""Wiring of one server process: settings -> store, Ray backend (a local head when no
``RAY_ADDRESS`` is set), job service, and the background work as named periodic units
(service/background/) that the server's lifespan starts and stops through one runner."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from service.background.periodic import Periodic
from service.background.runner import Runner
from service.cluster.local_cluster import LocalHead, ensure_head
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.eventlog.deliverer import POLL_S, Deliverer
from service.jobs import JobService
from service.monitor import ACCOUNT_EVERY_S, MIN_TICK_GAP_S, Monitor
from service.retention import Policy, Retention
from service.settings import Settings
from service.telemetry import instruments
from service.tenancy.bootstrap import bootstrap
from service.tenancy.projects import Projects
from service.tenancy.users import Users
from service.tracking.exporter import Exporter

log = logging.getLogger("raydock")


@dataclass
class Runtime:
    settings: Settings
    service: JobService
    monitor: Monitor
    head: LocalHead | None
    retention: Retention | None = None  # None: no retention policy set
    deliverer: Deliverer | None = None  # webhooks (service/eventlog/deliverer.py), on a thread of its own
    users: Users | None = None  # users and their tokens (service/tenancy/)
    projects: Projects | None = None
    runner: Runner | None = None  # the background units (``units``), started and stopped by the lifespan


def build_runtime(settings: Settings) -> Runtime:
    if not settings.http.is_loopback and not settings.auth.api_token:
        raise SystemExit(
            f"refusing to listen on {settings.http.host} without an API token: set RAYDOCK_API_TOKEN "
            "(clients then send 'Authorization: Bearer <token>'), or listen on 127.0.0.1"
        )
    settings.storage.prepare_data_dir()  # 0700, the SQLite file 0600
    head = None
    address = settings.cluster.ray_address
    if not address:
        head = ensure_head(
            settings.storage.data_dir / "ray",
            num_cpus=settings.cluster.local_num_cpus,
            auth_token_path=settings.local_head_token_path,
        )
        address = head.dashboard_url
        log.info("using local Ray head at %s (pid %s)", address, head.pid)
    sessions = make_sessionmaker(make_engine(settings.storage.resolved_database_url))
    bootstrap(sessions, settings.storage.data_dir)  # the first start's admin and its token file
    service = JobService(
        settings,
        sessions,
        RayBackend(
            address,
            autoscaler_config=settings.cluster.autoscaler_config,
            auth_token=head.auth_token() if head else None,
            warm_start=settings.startup.warm_start,
        ),
    )
    monitor = Monitor(service)
    policy = Policy.from_settings(settings)  # the event log's retention is always set: there is always a sweep
    retention = Retention(
        sessions,
        settings.storage.resolved_storage_path,
        policy,
        settings.retention.retention_interval_s,
        ray=service.backend,
        event_log_days=settings.retention.event_log_retention_days,
    )
    deliverer = Deliverer(settings, sessions)
    deliverer.on_attempt = instruments.webhook_delivered  # raydock_webhook_deliveries_total{outcome}
    users = Users(sessions, max_token_ttl_days=settings.auth.max_token_ttl_days)
    runner = units(settings, service, monitor, retention, deliverer)
    return Runtime(settings, service, monitor, head, retention, deliverer, users, Projects(sessions), runner)


def units(
    settings: Settings, service: JobService, monitor: Monitor, retention: Retention, deliverer: Deliverer
) -> Runner:
    """Every piece of background work, as a named unit with its cadence (not started)."""
    runner = Runner(observe=instruments.background_ran)  # raydock_background_runs_total{unit,outcome}
    # Follow, reconcile, admit, start, preempt; a submit wakes it (at most one tick per gap).
    tick = runner.add(
        Periodic(
            "monitor", settings.cluster.monitor_interval_s, monitor.tick, min_gap_s=MIN_TICK_GAP_S, max_backoff_s=5.0
        )
    )
    monitor.wake = service.on_submit = tick.wake
    runner.add(Periodic("usage", ACCOUNT_EVERY_S, monitor.account))
    runner.add(Periodic("code-collection", lambda: service.code.collect_every_s, service.code.collect))
    runner.add(Periodic("warm-pool", service.backend.pool.refresh_s, service.backend.refresh_warm_pool))
    runner.add(Periodic("retention", settings.retention.retention_interval_s, retention.sweep))
    # Reports to TensorBoard and MLflow, off the ingest path (service/tracking/exporter.py).
    exporter = Exporter(service.sessions, settings)
    runner.add(Periodic("tracking-export", settings.tracking.tracking_interval_s, exporter.export_once))
    # Webhooks: their posts run side by side on a loop of their own (their lanes are the deliverer's).
    runner.add(Periodic("webhooks", POLL_S, deliverer.deliver_once, own_thread=True, on_stop=deliverer.aclose))
    return runner
