"""scheduler: executions ledger

Revision ID: scheduler_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "scheduler_0001"
down_revision = None
branch_labels = ("scheduler",)
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "sched_executions",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("group_id", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("cell_id", sa.String(64), nullable=True),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("dispatched_seq", _SEQ, nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("failure_class", sa.String(32), nullable=True),
        sa.Column("finished_seq", _SEQ, nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("execution_id", name="pk_sched_executions"),
    )
    op.create_index("ix_sched_executions_group_id", "sched_executions", ["group_id"])
    op.create_index("ix_sched_executions_status", "sched_executions", ["status"])


def downgrade() -> None:
    op.drop_table("sched_executions")
