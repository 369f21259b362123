"""event integers: the columns that hold integers a job's events carry (their sequence
numbers, below 2**53, and the step and epoch of a report, int64) become BIGINT, so on
PostgreSQL a value at or over 2**31 is stored instead of failing the transaction

On SQLite every INTEGER already holds 64 bits; its tables are rebuilt (batch mode) only
so the declared types match the models. None of these tables is referenced by another,
so the rebuild (which drops the old table) cascades to nothing; ``jobs`` is not touched.
A downgrade first clears what INTEGER cannot hold: a step, epoch or best-report key out
of its range becomes NULL, a trial's last status key -1, and an event row whose own
sequence number is out of range is deleted.

Revision ID: 0007_event_integers
Revises: 0006_names
Create Date: 2026-12-02 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_event_integers"
down_revision = "0006_names"
branch_labels = None
depends_on = None

COLUMNS = {  # table -> (column, nullable)
    "metrics": [("src_seq", False), ("step", True), ("epoch", True)],
    "worker_groups": [("src_seq", False)],
    "trial_metrics": [("src_seq", False), ("step", True), ("epoch", True)],
    "trial_exploits": [("src_seq", False)],
    "checkpoints": [("step", True), ("epoch", True)],
    "trials": [("best_seq", True), ("event_seq", False)],
}
INT32 = (-(2**31), 2**31 - 1)


def _alter(old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column, nullable in columns:
                batch.alter_column(column, existing_type=old, type_=new, existing_nullable=nullable)


def upgrade() -> None:
    _alter(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    low, high = INT32
    out = "{c} < {low} OR {c} > {high}"
    for table, columns in COLUMNS.items():
        for column, nullable in columns:
            where = out.format(c=column, low=low, high=high)
            if column == "src_seq":
                op.execute(f"DELETE FROM {table} WHERE {where}")
            else:
                op.execute(f"UPDATE {table} SET {column} = {'NULL' if nullable else -1} WHERE {where}")
    _alter(sa.BigInteger(), sa.Integer())
