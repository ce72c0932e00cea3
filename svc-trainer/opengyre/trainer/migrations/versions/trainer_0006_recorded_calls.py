"""trainer: an execution's finish may carry the proxy's count of its recorded calls

Revision ID: trainer_0006
Revises: trainer_0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0006"
down_revision = "trainer_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trainer_executions") as batch:
        batch.add_column(sa.Column("recorded_calls", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trainer_executions") as batch:
        batch.drop_column("recorded_calls")
