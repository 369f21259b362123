"""job resources: what a job asks of the cluster beyond CPUs and GPUs (memory, custom
resources, GPUs of an accelerator type), as admission counts them (``service/queue.py``)

Revision ID: 0008_job_resources
Revises: 0007_event_integers
Create Date: 2026-11-26 10:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_job_resources"
down_revision = "0007_event_integers"
branch_labels = None
depends_on = None

COLUMNS = ("demand_extra", "holds_extra")


def upgrade() -> None:
    # Nullable columns added in place (no table copy on SQLite): NULL is "nothing beyond
    # CPUs and GPUs", which every job stored before this revision asks.
    with op.batch_alter_table("jobs", recreate="never") as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
