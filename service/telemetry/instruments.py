"""The counters and histograms this process keeps, in one registry of its own (the
gauges read from the store are added at scrape time by ``collector``). No series here
carries a job id: they live as long as the process, and a label per job would grow
without end. Every label takes values from a closed set (job kinds, statuses, causes,
outcomes, route templates)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Waits from a second to a day: a queue can hold a job for hours.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# Short durations: API requests (time to the response's start), the monitor's tick.
FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

SUBMITTED = Counter("raydock_jobs_submitted", "Jobs submitted (accepted and stored).", ["kind"], registry=REGISTRY)
FINISHED = Counter(
    "raydock_jobs_finished",
    "Jobs that reached an end status; cause is the failure cause of a FAILED job, '' otherwise.",
    ["kind", "status", "cause"],
    registry=REGISTRY,
)
FAILURES = Counter("raydock_job_failures", "Jobs that FAILED, by failure cause.", ["kind", "cause"], registry=REGISTRY)
RETRIES = Counter(
    "raydock_job_retries",
    "Attempts started again: 'resume' (a FAILED or CANCELLED job queued again), "
    "'worker_restart' (a training worker group restarted after a worker failure).",
    ["reason"],
    registry=REGISTRY,
)
ADMISSION_WAIT = Histogram(
    "raydock_admission_wait_seconds",
    "Time from entering the queue to being admitted (QUEUED -> STARTING).",
    ["kind"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
STARTUP = Histogram(
    "raydock_startup_seconds",
    "Time from admission to training (STARTING -> RUNNING), as seen by this API process.",
    ["kind"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
REQUESTS = Histogram(
    "raydock_http_request_duration_seconds",
    "API requests by route template and status class, timed to the start of the response "
    "(a stream counts until its first byte, not for as long as it stays open).",
    ["method", "route", "status"],
    buckets=FAST_BUCKETS,
    registry=REGISTRY,
)
EVENTS_INGESTED = Counter(
    "raydock_events_ingested", "Job events taken in, by channel (log or push).", ["channel"], registry=REGISTRY
)
EVENTS_DROPPED = Counter(
    "raydock_events_dropped",
    "Job events refused (invalid, over a bound, outside the job's storage), by channel.",
    ["channel"],
    registry=REGISTRY,
)
MONITOR_TICK = Histogram(
    "raydock_monitor_tick_seconds", "Time one monitor tick took.", buckets=FAST_BUCKETS, registry=REGISTRY
)
BACKGROUND_RUNS = Counter(
    "raydock_background_runs",
    "Runs of the server's background units (service/background/), by unit and outcome (ok, failed).",
    ["unit", "outcome"],
    registry=REGISTRY,
)
BACKGROUND_DURATION = Histogram(
    "raydock_background_run_seconds",
    "Time one run of a background unit took, by unit.",
    ["unit"],
    buckets=FAST_BUCKETS,
    registry=REGISTRY,
)
WEBHOOK_OUTCOMES = ("delivered", "retrying", "failed", "refused")
WEBHOOK_DELIVERIES = Counter(
    "raydock_webhook_deliveries",
    "Webhook delivery attempts by outcome: " + ", ".join(WEBHOOK_OUTCOMES) + ".",
    ["outcome"],
    registry=REGISTRY,
)
TRACKING_EXPORTED = Counter(
    "raydock_tracking_exported",
    "Metric reports exported to experiment trackers, by tool (tensorboard, mlflow).",
    ["tool"],
    registry=REGISTRY,
)
TRACKING_ERRORS = Counter("raydock_tracking_errors", "Failed export passes, by tool.", ["tool"], registry=REGISTRY)


def webhook_delivered(outcome: str) -> None:
    """Count one webhook delivery attempt (the event log's deliverer calls it after each post: its
    ``on_attempt`` hook); an outcome outside WEBHOOK_OUTCOMES counts as 'failed'."""
    WEBHOOK_DELIVERIES.labels(outcome if outcome in WEBHOOK_OUTCOMES else "failed").inc()


def background_ran(unit: str, ok: bool, seconds: float) -> None:
    """Count one run of a background unit (the runner's ``observe`` hook); the monitor's
    tick also keeps its own histogram."""
    BACKGROUND_RUNS.labels(unit, "ok" if ok else "failed").inc()
    BACKGROUND_DURATION.labels(unit).observe(seconds)
    if unit == "monitor":
        MONITOR_TICK.observe(seconds)


def submitted(kind: str) -> None:
    SUBMITTED.labels(kind).inc()


def events(channel: str, ingested: int, dropped: int) -> None:
    if ingested:
        EVENTS_INGESTED.labels(channel).inc(ingested)
    if dropped:
        EVENTS_DROPPED.labels(channel).inc(dropped)


def worker_restarted() -> None:
    RETRIES.labels("worker_restart").inc()
