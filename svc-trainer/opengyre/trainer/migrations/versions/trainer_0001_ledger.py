"""trainer: executions, trajectory calls, steps, published weights

Revision ID: trainer_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0001"
down_revision = None
branch_labels = ("trainer",)
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "trainer_executions",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(128), nullable=False),
        sa.Column("group_id", sa.String(128), nullable=False),
        sa.Column("group_size", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("dispatched_seq", _SEQ, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("failure_class", sa.String(32), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("n_calls", sa.Integer(), nullable=False),
        sa.Column("n_generated", sa.Integer(), nullable=False),
        sa.Column("finished_seq", _SEQ, nullable=True),
        sa.Column("consumed_run", sa.String(64), nullable=True),
        sa.Column("consumed_step", sa.Integer(), nullable=True),
        sa.Column("consumed_as", sa.String(96), nullable=True),
        sa.PrimaryKeyConstraint("execution_id", name="pk_trainer_executions"),
    )
    op.create_index("ix_trainer_executions_group_id", "trainer_executions", ["group_id"])
    op.create_index("ix_trainer_executions_finished_seq", "trainer_executions", ["finished_seq"])
    op.create_table(
        "trainer_calls",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("parent_call_id", sa.String(128), nullable=True),
        sa.Column("prefix_len", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("prompt_delta", sa.LargeBinary(), nullable=False),
        sa.Column("output_ids", sa.LargeBinary(), nullable=False),
        sa.Column("output_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "call_id", name="pk_trainer_calls"),
    )
    op.create_table(
        "trainer_steps",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("n_trained", sa.Integer(), nullable=False),
        sa.Column("n_dropped", sa.Integer(), nullable=False),
        sa.Column("staleness_mean", sa.Float(), nullable=False),
        sa.Column("staleness_max", sa.Integer(), nullable=False),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("reward_mean", sa.Float(), nullable=True),
        sa.Column("seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", name="pk_trainer_steps"),
    )
    op.create_table(
        "trainer_weights",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("uri", sa.String(1024), nullable=False),
        sa.Column("digest", sa.String(128), nullable=False),
        sa.Column("seq", _SEQ, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "weight_version", name="pk_trainer_weights"),
    )


def downgrade() -> None:
    op.drop_table("trainer_weights")
    op.drop_table("trainer_steps")
    op.drop_table("trainer_calls")
    op.drop_index("ix_trainer_executions_finished_seq", table_name="trainer_executions")
    op.drop_index("ix_trainer_executions_group_id", table_name="trainer_executions")
    op.drop_table("trainer_executions")
