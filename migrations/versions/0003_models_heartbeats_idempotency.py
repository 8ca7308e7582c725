"""registered models; job heartbeats and worker; one job per tenant and Idempotency-Key;
one metric row per job and step

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 10:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("model_type", sa.String(length=64), nullable=False),
        sa.Column("parameters", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("heartbeat_at", sqlmodel.sql.sqltypes.UTCDateTime(),
                                   nullable=True))
        batch.add_column(sa.Column("worker", sa.String(length=128), nullable=True))
        batch.create_index("ix_jobs_tenant_idempotency_key", ["tenant", "idempotency_key"],
                           unique=True)
    with op.batch_alter_table("metrics") as batch:
        batch.create_index("ix_metrics_job_id_step", ["job_id", "step"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.drop_index("ix_metrics_job_id_step")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_tenant_idempotency_key")
        batch.drop_column("worker")
        batch.drop_column("heartbeat_at")
    op.drop_table("models")
