"""caps: when each project last used each code package it holds (``code_refs.last_used_at``),
so a project is shown its own use of a package (never another project's) and its hold on
one it no longer uses lapses after the retention period, freeing its code quota

Revision ID: 0017_caps
Revises: 0016_identity
Create Date: 2026-11-27 15:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_caps"
down_revision = "0016_identity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("code_refs", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    # The package's last use stands for each holder's: no hold lapses sooner than its package would have.
    op.execute(
        "UPDATE code_refs SET last_used_at = "
        "(SELECT last_used_at FROM code_packages WHERE code_packages.sha256 = code_refs.sha256)"
    )
    op.execute("UPDATE code_refs SET last_used_at = created_at WHERE last_used_at IS NULL")


def downgrade() -> None:
    op.drop_column("code_refs", "last_used_at")  # SQLite >= 3.35
