"""launch files checked by the driver: the sha256 of the launch file written for the
attempt being prepared (``jobs.launch_sha256``), handed to its driver, which refuses a
file rewritten since

Revision ID: 0015_safewrite
Revises: 0014_sched
Create Date: 2026-11-27 15:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_safewrite"
down_revision = "0014_sched"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER, no batch rebuild: dropping ``jobs`` to rebuild it would cascade to every job's rows.
    op.add_column("jobs", sa.Column("launch_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "launch_sha256")  # SQLite >= 3.35
