"""fleets: how many times the reconciler asked again for a preparation whose ask was lost

Revision ID: 0013
Revises: 0012
Create Date: 2027-01-27 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleets") as batch:
        batch.add_column(sa.Column("prepare_retries", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("fleets") as batch:
        batch.drop_column("prepare_retries")
