"""comparisons: methods side by side on one model, dataset and device, each a set of jobs

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "comparisons",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=40), primary_key=True),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("model", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("device_id", sqlmodel.sql.sqltypes.AutoString(length=64),
                  sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sqlmodel.sql.sqltypes.AutoString(length=128),
                  nullable=True),
        sa.Column("request_sha256", sqlmodel.sql.sqltypes.AutoString(length=64),
                  nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    )
    with op.batch_alter_table("comparisons") as batch:
        batch.create_index("ix_comparisons_tenant", ["tenant"])
        batch.create_index("ix_comparisons_tenant_idempotency_key",
                           ["tenant", "idempotency_key"], unique=True)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("comparison_id", sa.String(length=40), nullable=True))
        batch.create_foreign_key("fk_jobs_comparison_id_comparisons", "comparisons",
                                 ["comparison_id"], ["id"])
        batch.create_index("ix_jobs_comparison_id", ["comparison_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_comparison_id")
        batch.drop_constraint("fk_jobs_comparison_id_comparisons", type_="foreignkey")
        batch.drop_column("comparison_id")
    op.drop_table("comparisons")
