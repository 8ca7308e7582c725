"""initial tables

Revision ID: 0001
Revises:
Create Date: 2026-11-30 09:14:40.783201
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("key_hash", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("scopes", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant"), ["tenant"], unique=False)

    op.create_table(
        "datasets",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("filename", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datasets_tenant"), ["tenant"], unique=False)

    op.create_table(
        "devices",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("ram_mb", sa.Integer(), nullable=True),
        sa.Column("budget_mb", sa.Integer(), nullable=True),
        sa.Column("chip", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
        sa.Column("relative_compute", sa.Float(), nullable=True),
        sa.Column("sources", sa.JSON(), nullable=False),
        sa.Column("builtin", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "fleets",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("model", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("fleets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_fleets_tenant"), ["tenant"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("model", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("device_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("memory_budget_bytes", sa.BigInteger(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=True),
        sa.Column("training_file", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("validation_file", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True),
        sa.Column("fleet_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True),
        sa.Column("idempotency_key", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
        sa.Column("enforcement", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
        sa.Column("error_code", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("error_message", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("last_loss", sa.Float(), nullable=True),
        sa.Column("peak_anon_bytes", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.ForeignKeyConstraint(
            ["fleet_id"],
            ["fleets.id"],
        ),
        sa.ForeignKeyConstraint(
            ["training_file"],
            ["datasets.id"],
        ),
        sa.ForeignKeyConstraint(
            ["validation_file"],
            ["datasets.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_fleet_id"), ["fleet_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_jobs_idempotency_key"), ["idempotency_key"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_tenant"), ["tenant"], unique=False)

    op.create_table(
        "adapters",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_job_id"), ["job_id"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("message", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_metrics_job_id"), ["job_id"], unique=False)



def downgrade() -> None:
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_metrics_job_id"))

    op.drop_table("metrics")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_job_id"))

    op.drop_table("events")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapters_job_id"))

    op.drop_table("adapters")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_tenant"))
        batch_op.drop_index(batch_op.f("ix_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_idempotency_key"))
        batch_op.drop_index(batch_op.f("ix_jobs_fleet_id"))

    op.drop_table("jobs")
    with op.batch_alter_table("fleets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_fleets_tenant"))

    op.drop_table("fleets")
    op.drop_table("devices")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_tenant"))

    op.drop_table("datasets")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant"))

    op.drop_table("api_keys")
