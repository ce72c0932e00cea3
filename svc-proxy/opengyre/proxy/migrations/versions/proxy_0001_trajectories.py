"""proxy: trajectory store (model calls, executions)

Revision ID: proxy_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "proxy_0001"
down_revision = None
branch_labels = ("proxy",)
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "proxy_calls",
        sa.Column("execution_id", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(64), nullable=False),
        sa.Column("seq", _SEQ, nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("parent_call_id", sa.String(64), nullable=True),
        sa.Column("prefix_len", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("prompt_delta", sa.LargeBinary(), nullable=False),
        sa.Column("output_ids", sa.LargeBinary(), nullable=False),
        sa.Column("output_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("engine_id", sa.String(255), nullable=False),
        sa.Column("weight_version", sa.String(64), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=False),
        sa.Column("dialect", sa.String(32), nullable=False),
        sa.Column("branch", sa.String(16), nullable=False),
        sa.Column("tool_calls", sa.Text(), nullable=False),
        sa.Column("queued_ms", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=False),
        sa.Column("total_ms", sa.Float(), nullable=False),
        sa.Column("drift_kind", sa.String(32), nullable=True),
        sa.Column("drift_position", sa.Integer(), nullable=True),
        sa.Column("drift_detail", sa.Text(), nullable=True),
        sa.Column("context", sa.Text(), nullable=True),
        sa.Column("context_ref", sa.String(255), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "call_id", name="pk_proxy_calls"),
    )
    op.create_index("ix_proxy_calls_seq", "proxy_calls", ["seq"])
    op.create_table(
        "proxy_executions",
        sa.Column("execution_id", sa.String(200), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("roots", sa.Integer(), nullable=False),
        sa.Column("drift", sa.Integer(), nullable=False),
        sa.Column("rerouted", sa.Integer(), nullable=False),
        sa.Column("stored_tokens", _SEQ, nullable=False),
        sa.Column("flat_tokens", _SEQ, nullable=False),
        sa.Column("first_seq", _SEQ, nullable=False),
        sa.Column("last_seq", _SEQ, nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", name="pk_proxy_executions"),
    )


def downgrade() -> None:
    op.drop_table("proxy_executions")
    op.drop_table("proxy_calls")
