"""The composition root: the one place the server is wired. ``build_runtime`` turns settings
into the store and the Ray backend (a local head when no ``RAY_ADDRESS`` is set);
``compose`` builds every other part from those and hands each its collaborators by name
(no part reaches the store or the cluster through another); ``units`` makes the
background work named periodic units (service/background/) that the server's lifespan
starts and stops through one runner. The HTTP app and the tests take parts from the
``Runtime`` it returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.orm import sessionmaker

from service.attempts import ACTIVE, Attempts
from service.background.periodic import Periodic
from service.background.runner import Runner
from service.cluster.local_cluster import LocalHead, ensure_head
from service.cluster.ray_backend import RayBackend
from service.code.packages import CodeStore
from service.db.engine import make_engine, make_sessionmaker, point_read_engine
from service.db.job_records import LoopReads
from service.db.leases import LeaseLost, Leases
from service.db.models import store_id
from service.db.wakes import Wakes
from service.eventlog.deliverer import POLL_S, Deliverer
from service.events.ingest import Ingest
from service.events.log_tails import LogTails
from service.events.push import Pushes
from service.health import Health
from service.job_reads import JobReads
from service.jobs import JobCommands
from service.monitor import ACCOUNT_EVERY_S, MIN_TICK_GAP_S, Monitor
from service.pipelines.commands import Pipelines
from service.pipelines.release import Release
from service.retention import Policy, Retention
from service.schedules.commands import Schedules
from service.schedules.firing import Firing
from service.scheduling.preemption import Preemptions
from service.scheduling.queue_keeper import QueueKeeper
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
    sessions: sessionmaker  # the store
    backend: RayBackend  # the one part that talks to Ray (service/cluster/)
    code: CodeStore  # uploaded code packages (service/code/)
    reads: JobReads  # reading jobs (service/job_reads.py)
    jobs: JobCommands  # submit, cancel, resume, delete (service/jobs.py)
    ingest: Ingest  # what running jobs report, from either channel (service/events/ingest.py)
    pushes: Pushes  # the HTTP channel's events in: its check, gate and batches (service/events/push.py)
    monitor: Monitor  # follows, reconciles, admits, starts and preempts (service/monitor.py)
    retention: Retention
    deliverer: Deliverer  # webhooks (service/eventlog/deliverer.py), on a thread of its own
    users: Users  # users and their tokens (service/tenancy/)
    projects: Projects
    runner: Runner  # the background units (``units``), started and stopped by the lifespan
    leases: Leases  # which replica runs each unit (service/db/leases.py)
    health: Health  # what GET /healthz says of this replica (service/health.py)
    schedules: Schedules  # cron schedules that submit jobs (service/schedules/); their unit is ``units``'
    pipelines: Pipelines  # jobs that run after others, as one graph (service/pipelines/)
    head: LocalHead | None = None  # the local Ray head this server started; None: RAY_ADDRESS


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
            storage_path=settings.storage.resolved_storage_path,  # an object store's variables go to the nodes
        )
        address = head.dashboard_url
        log.info("using local Ray head at %s (pid %s)", address, head.pid)
    sessions = make_sessionmaker(make_engine(settings.storage.resolved_database_url))
    bootstrap(sessions, settings.storage.data_dir)  # the first start's admin and its token file
    backend = RayBackend(
        address,
        autoscaler_config=settings.cluster.autoscaler_config,
        auth_token=head.auth_token() if head else None,
        warm_start=settings.startup.warm_start,
    )
    return compose(settings, sessions, backend, head)


def compose(settings: Settings, sessions: sessionmaker, backend: RayBackend, head: LocalHead | None = None) -> Runtime:
    """Every part over this store and this cluster, each handed its collaborators by name
    (the background units made, not started)."""
    code = CodeStore(settings, sessions)
    reads = JobReads(settings, sessions, LoopReads(point_read_engine(sessions.kw["bind"])))
    jobs = JobCommands(settings, sessions, backend, code, reads)
    storage_path = settings.storage.resolved_storage_path
    ingest = Ingest(sessions, storage_path, settings.events)
    pushes = Pushes(
        sessions,
        ingest,
        max_search_events=settings.events.max_search_events_per_push,
        events_per_transaction=settings.events.events_per_transaction,
    )
    monitor = Monitor(
        settings,
        sessions,
        backend,
        attempts=Attempts(settings, sessions, backend, code, store_id(sessions)),
        queue=QueueKeeper(
            sessions, backend, ACTIVE, settings.scheduling.default_quota, settings.scheduling.fair_share_half_life_s
        ),
        preemptions=Preemptions(sessions, storage_path, settings.scheduling.preemption_grace_s),
        tails=LogTails(backend, ingest),
        release=Release(sessions, reads),
    )
    policy = Policy.from_settings(settings)  # the event log's retention is always set: there is always a sweep
    retention = Retention(
        sessions,
        storage_path,
        policy,
        settings.retention.retention_interval_s,
        ray=backend,
        event_log_days=settings.retention.event_log_retention_days,
    )
    deliverer = Deliverer(settings, sessions)
    deliverer.on_attempt = instruments.webhook_delivered  # raydock_webhook_deliveries_total{outcome}
    users = Users(sessions, max_token_ttl_days=settings.auth.max_token_ttl_days)  # its revision: theirs and Projects'
    leases = Leases(sessions.kw["bind"], settings.replicas.lease_ttl_s)
    runner = units(settings, sessions, backend, code, jobs, monitor, retention, deliverer, leases)
    schedules = Schedules(sessions, jobs, settings.scheduling)
    parts = (
        code,
        reads,
        jobs,
        ingest,
        pushes,
        monitor,
        retention,
        deliverer,
        users,
        Projects(sessions, users.revision),
        runner,
        leases,
        Health(sessions.kw["bind"], backend, runner),
        schedules,
        Pipelines(sessions, jobs, settings.scheduling),
    )
    return Runtime(settings, sessions, backend, *parts, head)  # in the order of Runtime's fields


def units(
    settings: Settings,
    sessions: sessionmaker,
    backend: RayBackend,
    code: CodeStore,
    jobs: JobCommands,
    monitor: Monitor,
    retention: Retention,
    deliverer: Deliverer,
    leases: Leases,
) -> Runner:
    """Every piece of background work, as a named unit with its cadence (not started), each
    run on the one replica that holds its lease (the warm pool's snapshot on every one)."""
    # raydock_background_runs_total{unit,outcome}
    runner = Runner(observe=instruments.background_ran, leases=leases)
    # Follow, reconcile, admit, start, preempt; a submit wakes it (at most one tick per gap).
    tick = runner.add(
        Periodic(
            "monitor",
            settings.cluster.monitor_interval_s,
            monitor.tick,
            min_gap_s=MIN_TICK_GAP_S,
            max_backoff_s=5.0,
            fenced=True,  # admission and starts are proven under the monitor's lease (service/attempts.py)
        )
    )
    monitor.wake = jobs.on_submit = tick.wake
    wakes = Wakes(sessions.kw["bind"])
    if wakes.enabled:  # PostgreSQL: a submit on any replica wakes the monitor where it runs
        jobs.on_submit = lambda: (tick.wake(), wakes.notify())
        runner.add(
            Periodic("wakes", 0.0, lambda: wakes.listen(tick.wake), leased=False, own_thread=True, on_stop=wakes.stop)
        )
    # Fenced: their writes prove the lease in their own transactions (a paused holder writes nothing stale).
    fenced = {"fenced": True, "lost": (LeaseLost,)}
    runner.add(Periodic("usage", ACCOUNT_EVERY_S, monitor.account, **fenced))
    runner.add(Periodic("code-collection", lambda: code.collect_every_s, code.collect, **fenced))
    # This replica's own snapshot of the warm pool (what its reads show): on every replica.
    runner.add(Periodic("warm-pool", backend.pool.refresh_s, backend.refresh_warm_pool, leased=False))
    runner.add(
        Periodic("retention", settings.retention.retention_interval_s, lambda f: retention.sweep(fence=f), **fenced)
    )
    # Reports to TensorBoard and MLflow, off the ingest path (service/tracking/exporter.py).
    exporter = Exporter(sessions, settings)
    runner.add(Periodic("tracking-export", settings.tracking.tracking_interval_s, exporter.export_once))
    # Webhooks: their posts run side by side on a loop of their own (their lanes are the deliverer's).
    runner.add(
        Periodic("webhooks", POLL_S, deliverer.deliver_once, own_thread=True, on_stop=deliverer.aclose, **fenced)
    )
    # Schedules: each due tick's job, submitted once per tick (fenced: the tick and its job are one write).
    firing = Firing(sessions, jobs, settings.scheduling)
    runner.add(Periodic("schedules", firing.wait_s, firing.fire_due, fenced=True))
    return runner
