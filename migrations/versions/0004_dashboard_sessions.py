"""dashboard sessions: one row per sign-in, holding the hash of its random id

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("expires_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    op.create_index("ix_dashboard_sessions_tenant", "dashboard_sessions", ["tenant"])
    op.create_index("ix_dashboard_sessions_key_hash", "dashboard_sessions", ["key_hash"])
    op.create_index("ix_dashboard_sessions_expires_at", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_expires_at", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_key_hash", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_tenant", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
