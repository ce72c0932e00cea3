"""proxy: inline behaviour logprobs as float32, the one codec every store folds calls with

Revision ID: proxy_0005
Revises: proxy_0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "proxy_0005"
down_revision = "proxy_0004"
branch_labels = None
depends_on = None

_CALLS = sa.table(
    "proxy_calls",
    sa.column("execution_id", sa.String),
    sa.column("call_id", sa.String),
    sa.column("output_logprobs", sa.LargeBinary),
)


def _convert(src: str, dst: str) -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_CALLS.c.execution_id, _CALLS.c.call_id, _CALLS.c.output_logprobs).where(
            sa.func.length(_CALLS.c.output_logprobs) > 0
        )
    ).all()
    for r in rows:
        # float32 is what the engines produced: narrowing the float64 copies loses nothing they held.
        packed = np.frombuffer(r.output_logprobs, dtype=src).astype(dst).tobytes()
        conn.execute(
            sa.update(_CALLS)
            .where(_CALLS.c.execution_id == r.execution_id, _CALLS.c.call_id == r.call_id)
            .values(output_logprobs=packed)
        )


def upgrade() -> None:
    _convert("<f8", "<f4")


def downgrade() -> None:
    _convert("<f4", "<f8")
