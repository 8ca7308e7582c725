"""events and metrics: indexed by (job_id, id), so a page of a job's rows in id order (an
event stream's catch-up, the event poller) reads that page, never the job's whole history

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("events", "metrics"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_job_id")
            batch.create_index(f"ix_{table}_job_id_id", ["job_id", "id"])


def downgrade() -> None:
    for table in ("events", "metrics"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_job_id_id")
            batch.create_index(f"ix_{table}_job_id", ["job_id"])
