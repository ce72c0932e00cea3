"""synth: skill verdicts, task versions (lineage), hardening windows

Revision ID: synth_0002
Revises: synth_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "synth_0002"
down_revision = "synth_0001"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("synth_skills") as b:
        b.add_column(sa.Column("accepted", sa.Boolean(), server_default="1", nullable=False))
        b.add_column(sa.Column("reason", sa.Text(), server_default="", nullable=False))
        b.add_column(sa.Column("capabilities", sa.Text(), server_default="{}", nullable=False))
    op.create_table(
        "synth_task_versions",
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column("patterns", sa.Text(), nullable=False),
        sa.Column("task_dir", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("validated", sa.Boolean(), nullable=True),
        sa.Column("checks", sa.Text(), nullable=False),
        sa.Column("created_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("task_id", "version", name="pk_synth_task_versions"),
    )
    op.create_table(
        "synth_executions",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("task_version", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("actions", sa.Text(), nullable=False),
        sa.Column("updated_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("execution_id", name="pk_synth_executions"),
    )
    op.create_table(
        "synth_windows",
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("task_version", sa.Integer(), nullable=False),
        sa.Column("rewards", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("flagged_seq", _SEQ, nullable=True),
        sa.Column("too_easy_seq", _SEQ, nullable=True),
        sa.Column("hardened", sa.Boolean(), nullable=False),
        sa.Column("updated_seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("task_id", "task_version", name="pk_synth_windows"),
    )


def downgrade() -> None:
    op.drop_table("synth_windows")
    op.drop_table("synth_executions")
    op.drop_table("synth_task_versions")
    with op.batch_alter_table("synth_skills") as b:
        b.drop_column("capabilities")
        b.drop_column("reason")
        b.drop_column("accepted")
