"""quotas: the project a job runs in (``jobs.project``), whether it borrowed beyond its
project's guarantee, its accounted CPU- and GPU-seconds and its preemption deadline; the
tables ``project_quotas``, ``project_usage``, ``job_usage`` and ``usage_pending``

Revision ID: 0011_quotas
Revises: 0010_eventlog
Create Date: 2026-11-26 13:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_quotas"
down_revision = "0010_eventlog"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("project", sa.String(64), nullable=False, server_default="default"))
        b.add_column(sa.Column("borrowed", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("cpu_seconds", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("gpu_seconds", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("usage_as_of", AT, nullable=True))
        b.add_column(sa.Column("preempt_deadline", AT, nullable=True))
    op.create_index("ix_jobs_project", "jobs", ["project"])
    op.create_index("ix_jobs_status_project", "jobs", ["status", "project"])
    op.create_index("ix_jobs_project_queue", "jobs", ["status", "project", sa.text("priority DESC"), "queued_at", "id"])
    op.create_table(
        "project_quotas",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("guaranteed_cpus", sa.Float(), nullable=True),
        sa.Column("guaranteed_gpus", sa.Float(), nullable=True),
        sa.Column("max_cpus", sa.Float(), nullable=True),
        sa.Column("max_gpus", sa.Float(), nullable=True),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("updated_at", AT, nullable=False),
    )
    op.create_table(
        "project_usage",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("cpu_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("as_of", AT, nullable=False),
    )
    op.create_table(
        "job_usage",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("started_at", AT, nullable=False),
        sa.Column("until", AT, nullable=False),
        sa.Column("cpu_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
    )
    op.create_index("ix_job_usage_until", "job_usage", ["until"])
    op.create_index("ix_job_usage_project_until", "job_usage", ["project", "until"])
    op.create_table(
        "usage_pending",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("cpu_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_pending")
    op.drop_index("ix_job_usage_project_until", table_name="job_usage")
    op.drop_index("ix_job_usage_until", table_name="job_usage")
    op.drop_table("job_usage")
    op.drop_table("project_usage")
    op.drop_table("project_quotas")
    op.drop_index("ix_jobs_project_queue", table_name="jobs")
    op.drop_index("ix_jobs_status_project", table_name="jobs")
    op.drop_index("ix_jobs_project", table_name="jobs")
    with op.batch_alter_table("jobs") as b:
        for c in ("preempt_deadline", "usage_as_of", "gpu_seconds", "cpu_seconds", "borrowed", "project"):
            b.drop_column(c)
