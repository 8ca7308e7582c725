"""api_keys: a prefix to list a key by, an optional expiry, and when it was last used

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 12:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("prefix", sa.String(length=16), nullable=False,
                                   server_default=""))
        batch.add_column(sa.Column("expires_at", sqlmodel.sql.sqltypes.UTCDateTime(),
                                   nullable=True))
        batch.add_column(sa.Column("last_used_at", sqlmodel.sql.sqltypes.UTCDateTime(),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("last_used_at")
        batch.drop_column("expires_at")
        batch.drop_column("prefix")
