"""trial phases: the search trial a worker group belongs to (``worker_groups.trial_id``)
and each trial's start-up phases and those of its restarts after PBT exploits
(``trials.phases``)

Revision ID: 0021_trialphases
Revises: 0018_leases
Create Date: 2026-11-27 23:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_trialphases"
down_revision = "0019_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("worker_groups", sa.Column("trial_id", sa.String(64), nullable=True))
    op.add_column("trials", sa.Column("phases", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("trials", "phases")  # SQLite >= 3.35
    op.drop_column("worker_groups", "trial_id")
