"""event log: the append-only log of what happened to each job and to the server
(``event_log``), the webhook subscriptions of job specs (``webhooks``), each webhook
delivery's state (``webhook_deliveries``), and the per-job count of log rows a job's
own events made (``jobs.log_events``)

Revision ID: 0010_eventlog
Revises: 0009_tracking
Create Date: 2026-12-03 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_eventlog"
down_revision = "0009_tracking"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only
AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "event_log",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("at", AT, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_index("ix_event_log_job_id", "event_log", ["job_id", "id"])
    op.create_index("ix_event_log_type_id", "event_log", ["type", "id"])
    op.create_index("ix_event_log_at", "event_log", ["at"])
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", AT, nullable=False),
    )
    op.create_index("ix_webhooks_job_id", "webhooks", ["job_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("subscription", sa.String(64), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", AT, nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_duration_s", sa.Float(), nullable=True),
        sa.Column("created_at", AT, nullable=False),
        sa.Column("delivered_at", AT, nullable=True),
        sa.UniqueConstraint("subscription", "event_id"),
    )
    op.create_index(
        "ix_webhook_deliveries_state_sub_event", "webhook_deliveries", ["state", "subscription", "event_id"]
    )
    op.create_index("ix_webhook_deliveries_created", "webhook_deliveries", ["created_at"])
    # Plain ALTERs, no batch rebuild: dropping ``jobs`` to rebuild it would cascade to every job's rows.
    op.add_column("jobs", sa.Column("log_events", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "log_events")  # SQLite >= 3.35
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
    op.drop_table("event_log")
