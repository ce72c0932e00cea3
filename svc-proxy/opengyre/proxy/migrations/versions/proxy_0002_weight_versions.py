"""proxy: per-token weight versions of a call

Revision ID: proxy_0002
Revises: proxy_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "proxy_0002"
down_revision = "proxy_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("proxy_calls", sa.Column("weight_versions", sa.Text(), nullable=False, server_default="[]"))


def downgrade() -> None:
    op.drop_column("proxy_calls", "weight_versions")
