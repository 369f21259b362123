"""control plane at scale (typed queue columns, label rows, per-job counters, log
offsets), uploaded code packages, search resume and replay

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 12:00:00

Each part of the schema change has its own pair of functions below, so the parts can be
read (and grow) apart; ``upgrade`` and ``downgrade`` call them in order.
"""

import sqlalchemy as sa  # noqa: F401  (used by the parts as they grow)
from alembic import op  # noqa: F401

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _upgrade_jobs() -> None:
    """Queue and history: typed columns the monitor needs, labels, queue position."""


def _downgrade_jobs() -> None:
    pass


def _upgrade_events() -> None:
    """Ingestion and logs: per-job sequence counters, cumulative log offsets."""


def _downgrade_events() -> None:
    pass


def _upgrade_code() -> None:
    """Uploaded code packages and the jobs that reference them."""


def _downgrade_code() -> None:
    pass


def _upgrade_search() -> None:
    """Search resume and replay."""


def _downgrade_search() -> None:
    pass


def upgrade() -> None:
    _upgrade_jobs()
    _upgrade_events()
    _upgrade_code()
    _upgrade_search()


def downgrade() -> None:
    _downgrade_search()
    _downgrade_code()
    _downgrade_events()
    _downgrade_jobs()
