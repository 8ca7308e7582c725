"""webhooks: a job's or fleet's webhook URL, each tenant's signing secret, and the deliveries

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

String = sqlmodel.sql.sqltypes.AutoString
Moment = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    for table in ("jobs", "fleets"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("webhook_url", String(length=2048), nullable=True))
    op.create_table(
        "webhook_secrets",
        sa.Column("tenant", String(length=64), primary_key=True),
        sa.Column("secret", String(length=128), nullable=False),
        sa.Column("created_at", Moment(), nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", String(length=40), primary_key=True),
        sa.Column("tenant", String(length=64), nullable=False),
        sa.Column("job_id", String(length=40), sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("fleet_id", String(length=40), sa.ForeignKey("fleets.id"), nullable=True),
        sa.Column("fleet_event", String(length=32), nullable=True),
        sa.Column("event", String(length=64), nullable=False),
        sa.Column("url", String(length=2048), nullable=False),
        sa.Column("body", String(), nullable=False),
        sa.Column("status", String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", Moment(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", String(), nullable=True),
        sa.Column("created_at", Moment(), nullable=False),
        sa.Column("delivered_at", Moment(), nullable=True),
    )
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.create_index("ix_webhook_deliveries_job_id", ["job_id"])
        batch.create_index("ix_webhook_deliveries_status_next_attempt_at",
                           ["status", "next_attempt_at"])
        batch.create_index("ix_webhook_deliveries_fleet_id_fleet_event",
                           ["fleet_id", "fleet_event"], unique=True)


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_secrets")
    for table in ("fleets", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("webhook_url")
