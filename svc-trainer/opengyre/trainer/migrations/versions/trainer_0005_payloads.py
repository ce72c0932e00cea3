"""trainer: calls refer to their token payload (stored once, by digest); payload compaction

Revision ID: trainer_0005
Revises: trainer_0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "trainer_0005"
down_revision = "trainer_0004"
branch_labels = None
depends_on = None

_SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("trainer_calls") as batch:
        batch.add_column(sa.Column("n_prompt_delta", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("n_output", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("payload_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("payload_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("compacted_seq", _SEQ, nullable=True))
    # Rows folded before are all inline (int32 ids): their lengths follow from the packed arrays.
    op.execute("UPDATE trainer_calls SET n_prompt_delta = length(prompt_delta) / 4, n_output = length(output_ids) / 4")
    with op.batch_alter_table("trainer_calls") as batch:
        batch.alter_column("n_prompt_delta", server_default=None)
        batch.alter_column("n_output", server_default=None)
    with op.batch_alter_table("trainer_executions") as batch:
        batch.add_column(sa.Column("compacted_seq", _SEQ, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trainer_executions") as batch:
        batch.drop_column("compacted_seq")
    with op.batch_alter_table("trainer_calls") as batch:
        for name in ("compacted_seq", "payload_size", "payload_digest", "n_output", "n_prompt_delta"):
            batch.drop_column(name)
