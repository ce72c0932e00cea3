"""trainer: per-call weight-version spans (the weights changed while a call generated)

Revision ID: trainer_0003
Revises: trainer_0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0003"
down_revision = "trainer_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trainer_calls") as batch:
        batch.add_column(sa.Column("weight_spans", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("trainer_calls") as batch:
        batch.drop_column("weight_spans")
