"""elastic grants: an elastic job's worker range (``jobs.min_workers``, ``jobs.max_workers``)
and the most workers admission granted its attempt (``jobs.granted_workers``)

Revision ID: 0014_sched
Revises: 0013_start_phases
Create Date: 2026-11-27 15:45:00

Waiting and started elastic training jobs get their range from their spec, so admission
clamps them from their next start on; finished jobs keep NULL (a fixed size to admission).
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_sched"
down_revision = "0013_start_phases"
branch_labels = None
depends_on = None

_COLUMNS = ("min_workers", "max_workers", "granted_workers")
_LIVE = ("QUEUED", "STARTING", "RUNNING", "CANCELLING", "PREEMPTED")


def upgrade() -> None:
    # Plain ALTERs, no batch rebuild: dropping ``jobs`` to rebuild it would cascade to every job's rows.
    for name in _COLUMNS:
        op.add_column("jobs", sa.Column(name, sa.Integer(), nullable=True))
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("kind", sa.String),
        sa.column("status", sa.String),
        sa.column("spec", sa.JSON),
        sa.column("min_workers", sa.Integer),
        sa.column("max_workers", sa.Integer),
    )
    bind = op.get_bind()
    live = sa.select(jobs.c.id, jobs.c.spec).where(jobs.c.kind == "train", jobs.c.status.in_(_LIVE))
    for job_id, spec in bind.execute(live).all():
        workers = ((spec or {}).get("scaling") or {}).get("num_workers")
        if isinstance(workers, dict) and isinstance(workers.get("min"), int) and isinstance(workers.get("max"), int):
            values = {"min_workers": workers["min"], "max_workers": workers["max"]}
            bind.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))


def downgrade() -> None:
    for name in reversed(_COLUMNS):
        op.drop_column("jobs", name)  # SQLite >= 3.35
