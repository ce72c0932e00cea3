"""trainer: each call's sampling temperature (None: unknown, never trained), finish reason and engines

Revision ID: trainer_0004
Revises: trainer_0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0004"
down_revision = "trainer_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trainer_calls") as batch:
        batch.add_column(sa.Column("temperature", sa.Float(), nullable=True))
        batch.add_column(sa.Column("finish_reason", sa.String(length=32), nullable=False, server_default=""))
        batch.add_column(sa.Column("engine_id", sa.String(length=255), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("trainer_calls") as batch:
        batch.drop_column("engine_id")
        batch.drop_column("finish_reason")
        batch.drop_column("temperature")
