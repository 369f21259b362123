"""identity: Idempotency-Keys unique per project (``jobs.project_idempotency_key``, with a
unique index on (project, key)), and the end of local mode kept in ``server_meta``.

The old ``jobs.idempotency_key`` is unique server-wide. SQLite cannot drop a UNIQUE column,
nor its constraint, without rebuilding ``jobs``, and a rebuild drops the table, which
cascades to every job's rows; so the keys move to a new column and the old one is emptied
(NULLs never collide) and left unused, on both databases alike.

Revision ID: 0016_identity
Revises: 0015_safewrite
Create Date: 2026-11-27 15:40:00
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0016_identity"
down_revision = "0015_safewrite"
branch_labels = None
depends_on = None

INDEX = "uq_jobs_project_idempotency_key"
ENDED_KEY = "local_mode_ended"  # service/tenancy/local_mode.py


def upgrade() -> None:
    # Plain ALTERs, no batch rebuild (see above).
    op.add_column("jobs", sa.Column("project_idempotency_key", sa.String(200), nullable=True))
    op.execute(
        "UPDATE jobs SET project_idempotency_key = idempotency_key, idempotency_key = NULL "
        "WHERE idempotency_key IS NOT NULL"
    )
    op.create_index(INDEX, "jobs", ["project", "project_idempotency_key"], unique=True)
    # A server whose local mode had ended (a user other than admin was given a token) keeps it ended.
    others = sa.text(
        "SELECT 1 FROM api_tokens JOIN users ON users.id = api_tokens.user_id WHERE users.name <> 'admin' LIMIT 1"
    )
    if op.get_bind().execute(others).first() is not None:
        meta = sa.table("server_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
        op.bulk_insert(meta, [{"key": ENDED_KEY, "value": datetime.now(timezone.utc).isoformat()}])


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM server_meta WHERE key = :key").bindparams(key=ENDED_KEY))
    # A key used in two projects cannot go back into the server-wide unique column: one job of each keeps it.
    op.execute(
        "UPDATE jobs SET idempotency_key = project_idempotency_key WHERE id IN "
        "(SELECT MIN(id) FROM jobs WHERE project_idempotency_key IS NOT NULL GROUP BY project_idempotency_key)"
    )
    op.drop_index(INDEX, table_name="jobs")
    op.drop_column("jobs", "project_idempotency_key")  # SQLite >= 3.35
