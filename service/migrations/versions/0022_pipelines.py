"""pipelines: one row per pipeline (its steps' jobs in order), the pipeline a job is a
step of (``jobs.pipeline_id``), and the checkpoint the server resolved for a job's
``init_from`` when its dependencies ended (``jobs.init_checkpoint``)

Revision ID: 0022_pipelines
Revises: 0021_trialphases
Create Date: 2026-11-28 02:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022_pipelines"
down_revision = "0021_trialphases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_pipelines_project_created", "pipelines", ["project", "created_at"])
    op.add_column("jobs", sa.Column("pipeline_id", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("init_checkpoint", sa.Text(), nullable=True))
    op.create_index("ix_jobs_pipeline_id", "jobs", ["pipeline_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_pipeline_id", table_name="jobs")
    op.drop_column("jobs", "init_checkpoint")  # SQLite >= 3.35
    op.drop_column("jobs", "pipeline_id")
    op.drop_index("ix_pipelines_project_created", table_name="pipelines")
    op.drop_table("pipelines")
