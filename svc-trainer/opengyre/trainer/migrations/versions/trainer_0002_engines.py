"""trainer: engines of rollout cells (from cell events), reloaded after each step

Revision ID: trainer_0002
Revises: trainer_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0002"
down_revision = "trainer_0001"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "trainer_engines",
        sa.Column("cell_id", sa.String(64), nullable=False),
        sa.Column("engine_url", sa.String(255), nullable=True),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("cell_id", name="pk_trainer_engines"),
    )


def downgrade() -> None:
    op.drop_table("trainer_engines")
