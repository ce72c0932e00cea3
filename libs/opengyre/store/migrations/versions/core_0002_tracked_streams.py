"""core: the stream each projection's tracking rows count in

Revision ID: core_0002_streams
Revises: core_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "core_0002_streams"
down_revision = "core_0001"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "og_tracked_streams",
        sa.Column("projection", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("created", sa.String(64), nullable=False),
        sa.Column("last_seq", _SEQ, nullable=False),
        sa.Column("last_event_id", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("projection", name="pk_og_tracked_streams"),
    )


def downgrade() -> None:
    op.drop_table("og_tracked_streams")
