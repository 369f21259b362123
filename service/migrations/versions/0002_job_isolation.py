"""a job touches only its own record: hashed per-attempt events token, fixed submission
id, per-attempt runtime, dropped-event count, idempotency body hash, store id

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 09:30:00
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submission_id", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("events_token_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("idempotency_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("attempt_started_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("dropped_events", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("last_drop_reason", sa.Text(), nullable=True))
    # Tokens were stored in clear: keep running jobs' tokens valid, stored hashed.
    conn = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("events_token", sa.String),
        sa.column("events_token_hash", sa.String),
    )
    for job_id, token in conn.execute(sa.select(jobs.c.id, jobs.c.events_token)).all():
        if token:
            digest = hashlib.sha256(token.encode()).hexdigest()
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(events_token_hash=digest))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("events_token")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("events_token", sa.String(length=64), nullable=True))
        batch_op.drop_column("last_drop_reason")
        batch_op.drop_column("dropped_events")
        batch_op.drop_column("attempt_started_at")
        batch_op.drop_column("idempotency_hash")
        batch_op.drop_column("events_token_hash")
        batch_op.drop_column("submission_id")
    op.drop_table("server_meta")
