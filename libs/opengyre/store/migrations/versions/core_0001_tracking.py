"""core: tracking rows and dead letters

Revision ID: core_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "core_0001"
down_revision = None
branch_labels = ("core",)
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "og_tracking",
        sa.Column("projection", sa.String(64), nullable=False),
        sa.Column("stream_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("projection", "stream_seq", name="pk_og_tracking"),
    )
    op.create_table(
        "og_dead_letters",
        sa.Column("projection", sa.String(64), nullable=False),
        sa.Column("stream_seq", _SEQ, nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("projection", "stream_seq", name="pk_og_dead_letters"),
    )


def downgrade() -> None:
    op.drop_table("og_dead_letters")
    op.drop_table("og_tracking")
