"""metric rollups: each numeric metric's min and max over aligned blocks of a job's
reports, for downsampled series (service/events/rollups.py); stored series are rolled up here

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 15:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

CHUNK = 8192  # reports read at a time: a whole number of blocks of levels 1 to 5


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("vmin", sa.Float(), nullable=False),
        sa.Column("vmax", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "level", "block", "key"),
        sqlite_with_rowid=False,
    )
    _backfill(op.get_bind())


def _backfill(conn: sa.engine.Connection) -> None:
    """Every stored series, one job and CHUNK reports at a time, through the same fold
    ingestion uses (blocks a chunk shares with the next are merged by its upsert)."""
    from service.events import rollups

    if not rollups.supported(conn):
        return
    metrics = sa.table(
        "metrics", sa.column("job_id", sa.String), sa.column("seq", sa.Integer), sa.column("values", sa.JSON)
    )
    for (job_id,) in conn.execute(sa.select(metrics.c.job_id).distinct()).all():
        after = -1
        while True:
            q = sa.select(metrics.c.seq, metrics.c["values"]).where(metrics.c.job_id == job_id, metrics.c.seq > after)
            rows = [
                {"seq": seq, "values": values or {}}
                for seq, values in conn.execute(q.order_by(metrics.c.seq).limit(CHUNK))
            ]
            if not rows:
                break
            rollups.add(conn, job_id, rows)
            after = rows[-1]["seq"]


def downgrade() -> None:
    op.drop_table("metric_rollups")
