"""jobs: the cgroup's peak usage, kept apart from the charged peak

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 17:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cgroup_peak_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cgroup_peak_bytes")
