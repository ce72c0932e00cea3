"""proxy: the temperature of a call's recorded logprobs (None: unknown)

Revision ID: proxy_0003
Revises: proxy_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "proxy_0003"
down_revision = "proxy_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("proxy_calls", sa.Column("temperature", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("proxy_calls") as batch:
        batch.drop_column("temperature")
