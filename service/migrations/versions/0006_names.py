"""names: the jobs column of the last ignored event's reason is named as the API field
that shows it (``last_drop_reason`` -> ``last_dropped_reason``)

Revision ID: 0006_names
Revises: 0005_event_bounds
Create Date: 2026-12-02 10:00:00
"""

from alembic import op

revision = "0006_names"
down_revision = "0005_event_bounds"
branch_labels = None
depends_on = None


def _rename(old: str, new: str) -> None:
    # recreate="never": SQLite renames a column in place (ALTER TABLE ... RENAME COLUMN, SQLite
    # 3.25+). A recreating batch would copy `jobs` and drop the old table, and with foreign
    # keys on, that drop cascades to every row the jobs own.
    with op.batch_alter_table("jobs", recreate="never") as batch_op:
        batch_op.alter_column(old, new_column_name=new)


def upgrade() -> None:
    _rename("last_drop_reason", "last_dropped_reason")


def downgrade() -> None:
    _rename("last_dropped_reason", "last_drop_reason")
