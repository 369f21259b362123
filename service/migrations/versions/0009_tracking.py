"""tracking: where each job's export to TensorBoard and MLflow stands (service/tracking/),
and an index GET /metrics counts jobs by status and kind from

Revision ID: 0009_tracking
Revises: 0008_job_resources
Create Date: 2026-12-03 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_tracking"
down_revision = "0008_job_resources"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tracking_exports",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("tensorboard", sa.Boolean(), nullable=False),
        sa.Column("mlflow_experiment", sa.String(length=200), nullable=True),
        sa.Column("tensorboard_seq", sa.Integer(), nullable=False),
        sa.Column("tensorboard_trial_id", sa.BigInteger(), nullable=False),
        sa.Column("mlflow_seq", sa.Integer(), nullable=False),
        sa.Column("mlflow_trial_id", sa.BigInteger(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("trial_runs", sa.JSON(), nullable=False),
        sa.Column("finished_attempt", sa.Integer(), nullable=False),
        sa.Column("done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_tracking_exports_done", "tracking_exports", ["done"])
    op.create_index("ix_jobs_status_kind", "jobs", ["status", "kind"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_kind", table_name="jobs")
    op.drop_index("ix_tracking_exports_done", table_name="tracking_exports")
    op.drop_table("tracking_exports")
