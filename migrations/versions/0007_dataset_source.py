"""datasets: the dataset a fleet's shard was cut from (None: a whole upload)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("source_id", sa.String(length=40), nullable=True))
        batch.create_foreign_key("fk_datasets_source_id", "datasets", ["source_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_constraint("fk_datasets_source_id", type_="foreignkey")
        batch.drop_column("source_id")
