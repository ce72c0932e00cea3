"""trainer: a cell's row keeps whether it is resident, so the trainer folds cell events by the cell aggregate's rule

Revision ID: trainer_0007
Revises: trainer_0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0007"
down_revision = "trainer_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trainer_engines") as batch:
        batch.add_column(sa.Column("resident", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("trainer_engines") as batch:
        batch.drop_column("resident")
