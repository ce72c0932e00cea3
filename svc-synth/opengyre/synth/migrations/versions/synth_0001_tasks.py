"""synth: skills and tasks

Revision ID: synth_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "synth_0001"
down_revision = None
branch_labels = ("synth",)
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "synth_skills",
        sa.Column("skill_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(128), nullable=False),
        sa.Column("ingested_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("skill_id", name="pk_synth_skills"),
    )
    op.create_table(
        "synth_tasks",
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("skill_id", sa.String(128), nullable=False),
        sa.Column("task_version", sa.Integer(), nullable=False),
        sa.Column("validated", sa.Boolean(), nullable=True),
        sa.Column("too_easy_count", sa.Integer(), nullable=False),
        sa.Column("last_mean_reward", sa.Float(), nullable=True),
        sa.Column("hardened_count", sa.Integer(), nullable=False),
        sa.Column("updated_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("task_id", name="pk_synth_tasks"),
    )


def downgrade() -> None:
    op.drop_table("synth_tasks")
    op.drop_table("synth_skills")
