"""Strategies and helpers shared by the scheduler's tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from opengyre.events import (
    CellRegistered,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    TrainingStepCompleted,
)

ROLES = ["idle", "rollout", "draining", "switching", "training-core", "training-satellite"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(i: int) -> datetime:
    return T0 + timedelta(seconds=i)


@st.composite
def scheduler_events(draw: st.DrawFn, max_size: int = 60) -> list[Event]:
    """Random, often invalid, sequences over a small universe, so duplicates and bad orders are common."""
    n = draw(st.integers(1, max_size))
    out: list[Event] = []
    for i in range(n):
        kind = draw(st.sampled_from(["reg", "role", "disp", "disp", "fin", "fin", "step"]))
        at = _at(i)
        if kind == "reg":
            out.append(
                CellRegistered(
                    cell_id=f"c{draw(st.integers(0, 3))}", capacity=draw(st.integers(0, 4)),
                    role=draw(st.sampled_from(["rollout", "idle"])), resident=draw(st.booleans()), occurred_at=at,
                )
            )  # fmt: skip
        elif kind == "role":
            out.append(
                CellRoleChanged(
                    cell_id=f"c{draw(st.integers(0, 3))}", from_role=draw(st.sampled_from(ROLES)),
                    to_role=draw(st.sampled_from(ROLES)), occurred_at=at,
                )
            )  # fmt: skip
        elif kind == "disp":
            x = draw(st.integers(0, 9))
            out.append(
                ExecutionDispatched(
                    execution_id=f"x{x}", task_id="t", group_id=f"g{x // 2}", step=draw(st.integers(1, 4)),
                    weight_version=f"v{draw(st.integers(0, 4))}", group_size=draw(st.sampled_from([0, 2])),
                    occurred_at=at,
                )
            )  # fmt: skip
        elif kind == "fin":
            ok = draw(st.booleans())
            out.append(
                ExecutionFinished(
                    execution_id=f"x{draw(st.integers(0, 9))}", status="completed" if ok else "infra-failed",
                    score=1.0 if ok else None, occurred_at=at,
                )
            )  # fmt: skip
        else:
            ids = draw(st.lists(st.integers(0, 9), max_size=6))
            out.append(
                TrainingStepCompleted(
                    step=draw(st.integers(1, 5)), weight_version=f"v{draw(st.integers(1, 5))}", loss=0.0, n_samples=0,
                    n_tokens=0, execution_ids=[f"x{j}" for j in ids], occurred_at=at,
                )
            )  # fmt: skip
    return out
