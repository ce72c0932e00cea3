"""scheduler: cells, groups, weight versions, training steps; per-sample version and staleness

Revision ID: scheduler_0002
Revises: scheduler_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "scheduler_0002"
down_revision = "scheduler_0001"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("sched_executions") as b:
        b.add_column(sa.Column("version_step", sa.Integer(), server_default=sa.text("0"), nullable=False))
        b.add_column(sa.Column("consumed_step", sa.Integer(), nullable=True))
        b.add_column(sa.Column("staleness", sa.Integer(), nullable=True))
    op.create_table(
        "sched_cells",
        sa.Column("cell_id", sa.String(64), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("engine_url", sa.String(255), nullable=True),
        sa.Column("resident", sa.Boolean(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("registered_seq", _SEQ, nullable=False),
        sa.Column("role_seq", _SEQ, nullable=False),
        sa.Column("role_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("switch_from", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("cell_id", name="pk_sched_cells"),
    )
    op.create_table(
        "sched_groups",
        sa.Column("group_id", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("version_step", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("dispatched", sa.Integer(), nullable=False),
        sa.Column("finished", sa.Integer(), nullable=False),
        sa.Column("valid", sa.Integer(), nullable=False),
        sa.Column("last_finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("complete_seq", _SEQ, nullable=True),
        sa.Column("consumed_step", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("group_id", name="pk_sched_groups"),
    )
    op.create_index("ix_sched_groups_complete_seq", "sched_groups", ["complete_seq"])
    op.create_table(
        "sched_versions",
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("weight_version", name="pk_sched_versions"),
    )
    op.create_table(
        "sched_steps",
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("staleness_mean", sa.Float(), nullable=False),
        sa.Column("staleness_max", sa.Integer(), nullable=False),
        sa.Column("completed_seq", _SEQ, nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("step", name="pk_sched_steps"),
    )


def downgrade() -> None:
    op.drop_table("sched_steps")
    op.drop_table("sched_versions")
    op.drop_index("ix_sched_groups_complete_seq", "sched_groups")
    op.drop_table("sched_groups")
    op.drop_table("sched_cells")
    with op.batch_alter_table("sched_executions") as b:
        b.drop_column("staleness")
        b.drop_column("consumed_step")
        b.drop_column("version_step")
