"""job_checkpoints: the adapter a job kept at each checkpoint step, with its losses; a job
that ended with an adapter before (succeeded or cancelled, no fleet's phone) lists it as its
last checkpoint, as one ending now does

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_checkpoints",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), primary_key=True),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=40),
                  sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("valid_loss", sa.Float(), nullable=True),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    )
    op.create_index("ix_job_checkpoints_job_id_step", "job_checkpoints", ["job_id", "step"],
                    unique=True)
    _backfill()


def _backfill() -> None:
    """One row per job that kept an adapter: its newest, at the job's last step, with that
    step's losses (the id as ``service.job_checkpoints.checkpoint_id`` makes it)."""
    when = sqlmodel.sql.sqltypes.UTCDateTime()
    jobs = sa.table("jobs", sa.column("id"), sa.column("status"), sa.column("step"),
                    sa.column("fleet_id"))
    adapters = sa.table("adapters", sa.column("job_id"), sa.column("path"),
                        sa.column("sha256"), sa.column("bytes"),
                        sa.column("created_at", when))
    metrics = sa.table("metrics", sa.column("job_id"), sa.column("step"), sa.column("loss"),
                       sa.column("data", sa.JSON()))
    checkpoints = sa.table("job_checkpoints", *(sa.column(name) for name in (
        "id", "job_id", "step", "train_loss", "valid_loss", "path", "sha256", "bytes")),
        sa.column("created_at", when))
    bind = op.get_bind()
    found = bind.execute(
        sa.select(jobs.c.id, jobs.c.step, adapters.c.path, adapters.c.sha256,
                  adapters.c.bytes, adapters.c.created_at)
        .join(adapters, adapters.c.job_id == jobs.c.id)
        .where(jobs.c.status.in_(("succeeded", "cancelled")), jobs.c.fleet_id.is_(None))
        .order_by(adapters.c.created_at)).all()
    newest = {row.id: row for row in found}  # a job's newest adapter last
    for job in newest.values():
        metric = bind.execute(sa.select(metrics.c.loss, metrics.c.data).where(
            metrics.c.job_id == job.id, metrics.c.step == job.step)).first()
        bind.execute(checkpoints.insert().values(
            id=f"ckpt-{job.id.removeprefix('job-')}-{job.step}", job_id=job.id,
            step=job.step, train_loss=None if metric is None else metric.loss,
            valid_loss=None if metric is None else (metric.data or {}).get("val_loss"),
            path=job.path, sha256=job.sha256, bytes=job.bytes, created_at=job.created_at))


def downgrade() -> None:
    op.drop_index("ix_job_checkpoints_job_id_step", table_name="job_checkpoints")
    op.drop_table("job_checkpoints")
