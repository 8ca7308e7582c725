"""webhooks: a rotated secret's predecessor, signing beside it for a grace period

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 05:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_secrets") as batch:
        batch.add_column(sa.Column("previous_secret", sqlmodel.sql.sqltypes.AutoString(
            length=128), nullable=True))
        batch.add_column(sa.Column("previous_expires_at", sqlmodel.sql.sqltypes.UTCDateTime(),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_secrets") as batch:
        batch.drop_column("previous_expires_at")
        batch.drop_column("previous_secret")
