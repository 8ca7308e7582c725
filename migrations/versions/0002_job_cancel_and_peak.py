"""jobs: cancel flag, kernel-counted peak, error detail

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 10:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("error_detail", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("cancel_requested", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("peak_memory_bytes")
        batch.drop_column("cancel_requested")
        batch.drop_column("error_detail")
