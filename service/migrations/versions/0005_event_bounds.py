"""event bounds: per-job counters of the rows a job's events make (each kind capped,
service/events/limits.py) filled from what is stored; the count of worker restarts, with
the listed ones cut to the newest few; the deleting mark of chunked deletes; the key of
each trial's best report and the index GET /v1/jobs/{id}/best reads

Revision ID: 0005_event_bounds
Revises: 0004
Create Date: 2026-12-01 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_event_bounds"
down_revision = "0004"
branch_labels = None
depends_on = None

KEEP_RESTARTS = 10  # the default of RAYDOCK_MAX_RESTARTS_KEPT
COUNTERS = {  # the job's counter -> the table whose rows it counts
    "trial_metrics_stored": "trial_metrics",
    "trials_stored": "trials",
    "checkpoints_stored": "checkpoints",
    "exploits_stored": "trial_exploits",
}


def upgrade() -> None:
    # Plain ADD COLUMN, never a batch: on SQLite a batch copies the table and drops the old
    # one, and dropping `jobs` would cascade to every row its jobs own.
    for column in (*COUNTERS, "restarts_total"):
        op.add_column("jobs", sa.Column(column, sa.Integer(), server_default="0", nullable=False))
    op.add_column("jobs", sa.Column("deleting", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("trials", sa.Column("best_attempt", sa.Integer(), nullable=True))
    op.add_column("trials", sa.Column("best_seq", sa.Integer(), nullable=True))
    op.create_index("ix_trials_job_best", "trials", ["job_id", "best_metric"])
    conn = op.get_bind()
    for column, table in COUNTERS.items():
        conn.execute(
            sa.text(f"UPDATE jobs SET {column} = (SELECT count(*) FROM {table} WHERE {table}.job_id = jobs.id)")
        )
    _cut_restarts(conn)


def _cut_restarts(conn: sa.engine.Connection) -> None:
    """Count every job's restarts and keep the newest few listed (a job at a time)."""
    jobs = sa.table(
        "jobs", sa.column("id", sa.String), sa.column("restarts", sa.JSON), sa.column("restarts_total", sa.Integer)
    )
    after = ""
    while True:
        ids = list(conn.execute(sa.select(jobs.c.id).where(jobs.c.id > after).order_by(jobs.c.id).limit(500)).scalars())
        if not ids:
            break
        for job_id, restarts in conn.execute(sa.select(jobs.c.id, jobs.c.restarts).where(jobs.c.id.in_(ids))):
            if restarts:
                values = {"restarts_total": len(restarts), "restarts": restarts[-KEEP_RESTARTS:]}
                conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))
        after = ids[-1]


def downgrade() -> None:
    op.drop_index("ix_trials_job_best", table_name="trials")
    drops = [("trials", "best_seq"), ("trials", "best_attempt"), ("jobs", "deleting"), ("jobs", "restarts_total")]
    for table, column in drops + [("jobs", c) for c in reversed(COUNTERS)]:
        # ALTER TABLE ... DROP COLUMN (SQLite 3.35+) for the same reason: no table copy.
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
