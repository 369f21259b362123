"""schedules: one row per schedule (cron, time zone, policies, the job spec it submits,
the latest tick handled and the next one due)

Revision ID: 0019_schedules
Revises: 0018_leases
Create Date: 2026-11-27 23:15:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_schedules"
down_revision = "0018_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("cron", sa.String(120), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("concurrency", sa.String(16), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("job", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_tick", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.String(32), nullable=True),
        sa.Column("last_outcome", sa.Text(), nullable=True),
        sa.Column("fired", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("ix_schedules_project", "schedules", ["project"])
    op.create_index("ix_schedules_due", "schedules", ["paused", "next_tick"])


def downgrade() -> None:
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_index("ix_schedules_project", table_name="schedules")
    op.drop_table("schedules")
