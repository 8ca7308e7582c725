"""fleet preparation: a fleet's status (a worker may deal its rows), the error that ended its
preparation, and the seats it holds in its tenant's queue for jobs it has yet to make

Revision ID: 0011
Revises: 0010
Create Date: 2027-01-20 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleets") as batch:
        batch.add_column(sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=16),
                                   nullable=False, server_default="ready"))
        batch.add_column(sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch.add_column(sa.Column("reserved_jobs", sa.Integer(), nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("fleets") as batch:
        batch.drop_column("reserved_jobs")
        batch.drop_column("error")
        batch.drop_column("status")
