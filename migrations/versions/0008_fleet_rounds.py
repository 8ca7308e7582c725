"""fleet rounds: federated fleets train in rounds; jobs may start from a global adapter

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fleets") as batch:
        batch.add_column(sa.Column("cancel_requested", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("init_adapter", sa.String(length=1024), nullable=True))
    op.create_table(
        "fleet_rounds",
        sa.Column("fleet_id", sa.String(length=40), sa.ForeignKey("fleets.id"),
                  primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("participants", sa.JSON(), nullable=False),
        sa.Column("eval_loss", sa.Float(), nullable=True),
        sa.Column("simulated_wall_s", sa.Float(), nullable=True),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("fleet_rounds")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("init_adapter")
    with op.batch_alter_table("fleets") as batch:
        batch.drop_column("cancel_requested")
