"""proxy: executions whose sealed finish the log holds (the outbox forgets their seals once they are here)

Revision ID: proxy_0006
Revises: proxy_0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "proxy_0006"
down_revision = "proxy_0005"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "proxy_sealed",
        sa.Column("execution_id", sa.String(200), primary_key=True),
        sa.Column("recorded_calls", sa.Integer(), nullable=False),
        sa.Column("seq", _SEQ, nullable=False),
    )
    op.create_index("ix_proxy_sealed_seq", "proxy_sealed", ["seq"])


def downgrade() -> None:
    op.drop_index("ix_proxy_sealed_seq", "proxy_sealed")
    op.drop_table("proxy_sealed")
