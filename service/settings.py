"""Server settings, read from ``RAYDOCK_*`` environment variables (and ``RAY_ADDRESS``,
``RAY_AUTH_TOKEN_PATH``)."""

from __future__ import annotations

import ipaddress
import os
from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import SettingsConfigDict

from api.schemas.quotas import QuotaSpec
from api.schemas.tenancy import DEFAULT_TOKEN_TTL_DAYS, MAX_TOKEN_TTL_DAYS
from service.client_limits import ClientLimits


class Settings(ClientLimits):
    model_config = SettingsConfigDict(env_prefix="RAYDOCK_", extra="ignore")

    data_dir: Path = Field(
        default=Path.home() / ".raydock", description="Where SQLite, the local cluster and checkpoints live."
    )
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in data_dir when unset.")
    storage_path: str | None = Field(
        default=None, description="Checkpoint storage: a directory or a pyarrow URI (s3://...)."
    )
    ray_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_ADDRESS", "RAYDOCK_RAY_ADDRESS"),
        description="Dashboard URL of an existing Ray cluster (http://host:8265); a local head is started when unset.",
    )
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8000, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None,
        description="URL the cluster uses to reach this API for live events; derived from host/port when unset.",
    )
    api_token: str | None = Field(default=None, description="Bearer token required by the API; mandatory off loopback.")
    open_docs: bool = Field(
        default=False,
        description="Serve /docs, /redoc and /openapi.json without the API token (they need it when one is set).",
    )
    metrics_token: str | None = Field(
        default=None,
        max_length=512,
        description="Bearer token GET /metrics requires instead of the API token (for a Prometheus that holds no API token).",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None,
        max_length=2048,
        description="MLflow tracking URI jobs with `tracking.mlflow` export to (http(s)://, file:, sqlite:); unset: refused at submit.",
    )
    tracking_interval_s: float = Field(
        default=2.0, gt=0, le=3600, description="How often the tracking exporter looks for new reports to export."
    )
    local_num_cpus: int | None = Field(default=None, description="CPUs the local Ray head advertises (default: all).")
    monitor_interval_s: float = Field(default=0.5, description="How often job statuses are polled.")
    train_health_check_interval_s: float = Field(
        default=0.2,
        description="Ray Train controller poll interval for jobs; low values surface reports and job ends sooner.",
    )
    cluster_lost_after_s: float = Field(
        default=120.0,
        description="Fail active jobs (INFRASTRUCTURE) once the Ray cluster has been unreachable this long.",
    )
    worker_start_timeout_s: float = Field(default=60.0, description="How long a worker group may take to start.")
    default_quota: QuotaSpec = Field(
        default_factory=QuotaSpec,
        description="The quota of a project with none of its own (JSON, the body of PUT /v1/projects/{name}/quota); "
        "unset: unlimited, guarantee 0.",
    )
    fair_share_half_life_s: float = Field(
        default=3600.0,
        le=366 * 86_400,
        description="Half-life of the recent usage that orders projects in the queue.",
    )
    max_token_ttl_days: float = Field(
        default=DEFAULT_TOKEN_TTL_DAYS,
        gt=0,
        le=MAX_TOKEN_TTL_DAYS,
        description="The longest an API token made over the API lives: one asked for with no expiry gets this one; "
        "one asked for longer is refused (422 token_lifetime_too_long).",
    )
    preemption_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="How long a preempted job has to write a last checkpoint before its Ray job is stopped.",
    )

    @field_validator("fair_share_half_life_s")
    @classmethod
    def _half_life(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(
                "RAYDOCK_FAIR_SHARE_HALF_LIFE_S must be more than 0 seconds: 0 would switch fair share off "
                "(recent usage would never count). Set it to how long usage should weigh, e.g. 3600."
            )
        return v

    local_ranks: bool = Field(
        default=True,
        description=(
            "Run a fixed-size training job whose workers fit one node as processes forked from its Ray job "
            "driver (Ray Train local mode, torchrun's environment) instead of Train controller and worker actors."
        ),
    )
    warm_start: bool = Field(
        default=True,
        description=(
            "Start each job's driver as a fork of its node's warm process (torch and ray.train already imported); "
            "false: every driver is a new Python process, as before."
        ),
    )
    warm_idle_s: float = Field(
        default=600.0,
        ge=1,
        le=7 * 24 * 3600,
        description="How long a node's warm process waits for a job before it exits (the next job there starts cold).",
    )
    autoscaler_config: str | None = Field(
        default=None,
        description="The Ray autoscaler's cluster config (YAML/JSON), for the node limits its status report leaves out.",
    )
    code_root: str | None = Field(
        default=None,
        description=(
            "Directories on the server (separated by ':') whose contents jobs may ship to the cluster as "
            "`working_dir` or `runtime_env.py_modules`; a relative `working_dir` is taken from the first. "
            "Unset: jobs may name no server path (remote py_modules URIs still work)."
        ),
    )
    code_max_bytes: int = Field(
        default=100 * 1024 * 1024,
        ge=1,
        lt=2**31,
        description="Largest working_dir or py_module (bytes, all files together) a job may ship; also the cap of an uploaded package.",
    )
    code_max_files: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="Most files and directories a job's working_dir, py_module or uploaded package may hold.",
    )
    pip_allowed_hosts_raw: str = Field(
        default="",
        validation_alias=AliasChoices("RAYDOCK_PIP_ALLOWED_HOSTS"),
        description=(
            "Hosts (comma-separated) a runtime_env pip/uv entry may install from by URL (`pkg @ https://host/...`); "
            "unset: no direct URL references."
        ),
    )
    max_concurrent_uploads: int = Field(
        default=4, ge=1, le=1000, description="Code uploads taken in at once; more get 429 too_many_uploads."
    )
    code_quota_bytes: int = Field(
        default=1 << 30,
        ge=1,
        lt=2**53,
        description="Most bytes of uploaded code packages one project may hold (413 code_quota_exceeded past it).",
    )
    code_retention_s: float = Field(
        default=7 * 86_400,
        ge=0,
        le=10 * 366 * 86_400,
        description="How long an uploaded code package that no job references is kept after its last upload or submit.",
    )
    max_log_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        le=1 << 40,
        description=(
            "Most bytes of one job's log kept in the store: the first quarter (the head) and the newest rest (the tail); "
            "the middle is dropped and a line in its place says how many bytes. Events in dropped text are still taken in."
        ),
    )
    # What one job's events may store (service/events/limits.py); past a bound, events are dropped and counted.
    max_metrics_per_job: int = Field(
        default=1_000_000, ge=1, lt=2**31, description="Most metric reports stored per job."
    )
    max_trial_reports_per_job: int = Field(
        default=1_000_000, ge=1, lt=2**31, description="Most trial reports stored per search."
    )
    max_trials_per_job: int = Field(default=10_000, ge=1, lt=2**31, description="Most trials stored per search.")
    max_worker_groups_per_job: int = Field(
        default=10_000, ge=1, lt=2**31, description="Most worker-group starts stored per job."
    )
    max_checkpoints_per_job: int = Field(
        default=100_000, ge=1, lt=2**31, description="Most checkpoint rows stored per job."
    )
    max_exploits_per_job: int = Field(
        default=100_000, ge=1, lt=2**31, description="Most PBT exploits stored per search."
    )
    max_restarts_kept: int = Field(
        default=10, ge=1, le=1000, description="Newest worker restarts a job record lists (all are counted)."
    )
    max_search_events_per_push: int = Field(
        default=200,
        ge=1,
        le=1000,
        description="Most search events (trial reports, trial statuses, exploits) in one events post.",
    )
    events_per_transaction: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Events of a post stored per transaction, so a push holds the write lock briefly.",
    )
    retention_days: float | None = Field(
        default=None, gt=0, description="Delete finished jobs (rows and storage) this many days after they finished."
    )
    retention_max_finished: int | None = Field(
        default=None,
        ge=0,
        description="Keep at most this many finished jobs, the most recently finished; delete the rest.",
    )
    retention_interval_s: float = Field(
        default=60.0, gt=0, description="How often the background retention sweep runs."
    )
    event_log_retention_days: float = Field(
        default=90.0,
        gt=0,
        le=36_600,
        description="Event-log rows (and webhook deliveries) older than this many days are deleted by the retention sweep.",
    )
    max_log_events_per_job: int = Field(
        default=10_000,
        ge=10,
        lt=2**31,
        description=(
            "Most event-log rows a job's own events make (checkpointed, retried, resized); past it they are counted, "
            "not logged. Status changes and what callers do are always logged."
        ),
    )
    webhooks_raw: str = Field(
        default="",
        validation_alias=AliasChoices("RAYDOCK_WEBHOOKS"),
        description=(
            'Server webhooks, a JSON list of {"name", "url", "events", "secret"}: every event of the listed types '
            '(["*"]: all) is posted to url, signed with secret.'
        ),
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhooks target loopback, link-local, private and other non-public addresses (refused by default).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="How long one whole webhook post may take."
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=100, description="Tries of one webhook delivery before it is marked failed."
    )
    webhook_backoff_s: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Wait before the second try of a delivery; doubled for each further try.",
    )
    webhook_backoff_max_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Longest wait between two tries of a delivery."
    )
    webhook_concurrency: int = Field(
        default=4, ge=1, le=256, description="Jobs' webhook posts in flight at once (each job posts one at a time)."
    )
    ray_auth_token_path: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAYDOCK_RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN_PATH"),
        description=(
            "Ray token file. The local head runs with token auth and this token (created, mode 0600, when "
            "missing; default <data_dir>/ray/auth_token). For a RAY_ADDRESS cluster: the token its dashboard expects."
        ),
    )

    @property
    def pip_allowed_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.pip_allowed_hosts_raw.split(",") if h.strip())

    @property
    def code_roots(self) -> list[Path]:
        """The code roots, symlinks and ``..`` resolved."""
        return [
            Path(os.path.realpath(os.path.expanduser(p))) for p in (self.code_root or "").split(os.pathsep) if p.strip()
        ]

    @property
    def local_head_token_path(self) -> Path:
        return self.ray_auth_token_path or self.data_dir / "ray" / "auth_token"

    def prepare_data_dir(self) -> None:
        """Create the data dir readable by the server's user only (it holds every job's
        record and the cluster token), and the SQLite file 0600 before SQLite makes it
        (its -wal/-shm files copy the database file's mode)."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _chmod(self.data_dir, 0o700)
        db = self.sqlite_path
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
            for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                _chmod(path, 0o600)

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite database file, or None for another database (or an in-memory one)."""
        from sqlalchemy.engine import make_url

        url = make_url(self.resolved_database_url)
        if (
            url.get_backend_name() != "sqlite"
            or not url.database
            or url.database == ":memory:"
            or url.database.startswith("file:")
        ):
            return None
        return Path(url.database)

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'raydock.db'}"

    @cached_property
    def resolved_storage_path(self) -> str:
        return self.storage_path or str((self.data_dir / "storage").resolve())

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def events_base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host
        return f"http://{host}:{self.port}"


def _chmod(path: Path, mode: int) -> None:
    """Tighten a path the server owns; a path owned by someone else is left as it is."""
    try:
        if path.exists() and path.stat().st_uid == os.geteuid():
            path.chmod(mode)
    except OSError:
        pass
