"""control plane at scale (typed queue columns, label rows, per-job counters, log
offsets), uploaded code packages, search resume and replay

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 12:00:00

Each part of the schema change has its own pair of functions below, so the parts can be
read (and grow) apart; ``upgrade`` and ``downgrade`` call them in order.
"""

import sqlalchemy as sa  # noqa: F401  (used by the parts as they grow)
from alembic import op  # noqa: F401

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


_JOB_COLUMNS = ("demand_cpus", "demand_gpus", "holds_cpus", "holds_gpus", "scheduling_timeout_s", "max_runtime_s")
_JOB_INDEXES = {
    "ix_jobs_created_id": ["created_at", "id"],
    "ix_jobs_status_created_id": ["status", "created_at", "id"],
    "ix_jobs_queue": ["status", sa.text("priority DESC"), "queued_at", "id", "submission_id", "queue_position"],
    "ix_jobs_status_finished": ["status", "finished_at"],
    "ix_jobs_submission": ["submission_id"],
    "ix_jobs_status_deadline": ["status", "scheduling_timeout_s"],
    "ix_jobs_status_demand": ["status", "demand_cpus", "demand_gpus"],
}


def _upgrade_jobs() -> None:
    """Queue and history: typed columns the monitor needs, labels, queue position.
    The typed columns of jobs stored before stay NULL: the monitor fills them from the
    spec the first time it sees such a job (service/queue.py)."""
    with op.batch_alter_table("jobs") as batch:
        for name in _JOB_COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.add_column(sa.Column("queue_position", sa.Integer(), nullable=True))
    for name, columns in _JOB_INDEXES.items():
        op.create_index(name, "jobs", columns)
    labels = op.create_table(
        "job_labels",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_labels_key_value_created", "job_labels", ["key", "value", "created_at", "job_id"])
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("labels", sa.JSON),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    rows = [
        {"job_id": job_id, "key": str(k), "value": str(v), "created_at": created_at}
        for job_id, found, created_at in op.get_bind().execute(sa.select(jobs.c.id, jobs.c.labels, jobs.c.created_at))
        for k, v in (found or {}).items()
    ]
    if rows:
        op.bulk_insert(labels, rows)


def _downgrade_jobs() -> None:
    op.drop_index("ix_job_labels_key_value_created", table_name="job_labels")
    op.drop_table("job_labels")
    for name in _JOB_INDEXES:
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for name in (*_JOB_COLUMNS, "queue_position"):
            batch.drop_column(name)


EVENT_COUNTERS = (
    "metrics_stored",
    "attempt_metrics",
    "attempt_metrics_of",
    "worker_groups_stored",
    "log_end",
    "log_stored_bytes",
)
LOG_COLUMNS = ("start_offset", "end_offset", "nbytes", "head", "dropped_bytes")


def _upgrade_events() -> None:
    """Ingestion and logs: per-job sequence counters, cumulative log offsets."""
    with op.batch_alter_table("jobs") as batch:
        for name in ("metrics_stored", "attempt_metrics", "attempt_metrics_of", "worker_groups_stored"):
            batch.add_column(sa.Column(name, sa.Integer(), server_default="0", nullable=False))
        for name in ("log_end", "log_stored_bytes"):
            batch.add_column(sa.Column(name, sa.BigInteger(), server_default="0", nullable=False))
    with op.batch_alter_table("log_chunks") as batch:
        batch.add_column(sa.Column("start_offset", sa.BigInteger(), server_default="0", nullable=False))
        batch.add_column(sa.Column("end_offset", sa.BigInteger(), server_default="0", nullable=False))
        batch.add_column(sa.Column("nbytes", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("head", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column("dropped_bytes", sa.BigInteger(), nullable=True))
    op.create_index("ix_metrics_job_seq", "metrics", ["job_id", "seq"])
    op.create_index("ix_log_chunks_job_end", "log_chunks", ["job_id", "end_offset"])
    conn = op.get_bind()
    # The counters start from what is stored (once, here; never again per event).
    conn.execute(
        sa.text(
            "UPDATE jobs SET metrics_stored = (SELECT count(*) FROM metrics m WHERE m.job_id = jobs.id),"
            " attempt_metrics = (SELECT count(*) FROM metrics m WHERE m.job_id = jobs.id AND m.attempt = jobs.attempt),"
            " attempt_metrics_of = attempt,"
            " worker_groups_stored = (SELECT count(*) FROM worker_groups w WHERE w.job_id = jobs.id)"
        )
    )
    # Stored chunks get their place in the job's whole log, one job at a time.
    chunks = sa.table("log_chunks", *(sa.column(c) for c in ("id", "job_id", "text", *LOG_COLUMNS)))
    jobs = sa.table("jobs", sa.column("id"), sa.column("log_end"), sa.column("log_stored_bytes"))
    for (job_id,) in conn.execute(sa.select(chunks.c.job_id).distinct()).all():
        end = size = 0
        for chunk_id, text in conn.execute(
            sa.select(chunks.c.id, chunks.c.text).where(chunks.c.job_id == job_id).order_by(chunks.c.id)
        ):
            n = len(text.encode())
            conn.execute(
                chunks.update()
                .where(chunks.c.id == chunk_id)
                .values(start_offset=end, end_offset=end + len(text), nbytes=n)
            )
            end, size = end + len(text), size + n
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(log_end=end, log_stored_bytes=size))


def _downgrade_events() -> None:
    op.drop_index("ix_log_chunks_job_end", table_name="log_chunks")
    op.drop_index("ix_metrics_job_seq", table_name="metrics")
    with op.batch_alter_table("log_chunks") as batch:
        for name in reversed(LOG_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("jobs") as batch:
        for name in reversed(EVENT_COUNTERS):
            batch.drop_column(name)


def _upgrade_code() -> None:
    """Uploaded code packages and the jobs that reference them."""
    op.create_table(
        "code_packages",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("content_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_index("ix_code_packages_last_used_at", "code_packages", ["last_used_at"])
    op.create_table(
        "job_code",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_job_code_sha256", "job_code", ["sha256"])


def _downgrade_code() -> None:
    op.drop_index("ix_job_code_sha256", table_name="job_code")
    op.drop_table("job_code")
    op.drop_index("ix_code_packages_last_used_at", table_name="code_packages")
    op.drop_table("code_packages")


def _upgrade_search() -> None:
    """Search resume and replay; a trial's note (e.g. PBT cannot carry a loop's weights)."""
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("note", sa.Text(), nullable=True))


def _downgrade_search() -> None:
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_column("note")


def upgrade() -> None:
    _upgrade_jobs()
    _upgrade_events()
    _upgrade_code()
    _upgrade_search()


def downgrade() -> None:
    _downgrade_search()
    _downgrade_code()
    _downgrade_events()
    _downgrade_jobs()
