"""start-up phases: the latest attempt's phases on the job (``jobs.start_phases``), and
each search trial's start and the seconds to its first report (``trials.started_ts``,
``trials.first_metric_s``)

Revision ID: 0013_start_phases
Revises: 0011_quotas
Create Date: 2026-11-26 13:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_start_phases"
down_revision = "0011_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTERs, no batch rebuild: dropping ``jobs`` to rebuild it would cascade to every job's rows.
    op.add_column("jobs", sa.Column("start_phases", sa.JSON(), nullable=True))
    op.add_column("trials", sa.Column("started_ts", sa.Float(), nullable=True))
    op.add_column("trials", sa.Column("first_metric_s", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("trials", "first_metric_s")  # SQLite >= 3.35
    op.drop_column("trials", "started_ts")
    op.drop_column("jobs", "start_phases")
