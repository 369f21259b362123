"""identity: users, their API tokens (sha256 only), projects, memberships with a role,
the code packages each project holds (``code_refs``), and who submitted each job
(``jobs.user_id``). The project ``default`` exists from here on; every package already
stored is held by it.

Revision ID: 0012_identity
Revises: 0010_eventlog (0011_quotas once that lands: re-chained at merge)
Create Date: 2026-11-26 13:40:00
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0012_identity"
down_revision = "0011_quotas"
branch_labels = None
depends_on = None

AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", AT, nullable=False),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("created_at", AT, nullable=False),
        sa.Column("expires_at", AT, nullable=True),
        sa.Column("revoked_at", AT, nullable=True),
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])
    projects = op.create_table(
        "projects",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("created_at", AT, nullable=False),
    )
    op.create_table(
        "memberships",
        sa.Column("project", sa.String(64), sa.ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", AT, nullable=False),
    )
    op.create_index("ix_memberships_user_id", "memberships", ["user_id"])
    op.create_table(
        "code_refs",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("created_at", AT, nullable=False),
    )
    op.create_index("ix_code_refs_sha256", "code_refs", ["sha256"])
    op.bulk_insert(projects, [{"name": "default", "created_at": datetime.now(timezone.utc)}])
    # Every package stored before projects existed belongs to the project every old job is in.
    op.execute(
        "INSERT INTO code_refs (project, sha256, created_at) SELECT 'default', sha256, created_at FROM code_packages"
    )
    # Plain ALTERs, no batch rebuild: dropping ``jobs`` to rebuild it would cascade to every job's rows.
    op.add_column("jobs", sa.Column("user_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "user_id")  # SQLite >= 3.35
    for table in ("code_refs", "memberships", "projects", "api_tokens", "users"):
        op.drop_table(table)
