"""leases: one row per background unit (``leases``: holder, fencing token, since, expires_at)
and one per live replica (``replicas``), so each unit runs on one replica at a time

Revision ID: 0018_leases
Revises: 0017_caps
Create Date: 2026-11-27 20:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_leases"
down_revision = "0017_caps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(160), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(160), primary_key=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_replicas_seen_at", "replicas", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_replicas_seen_at", table_name="replicas")
    op.drop_table("replicas")
    op.drop_table("leases")
