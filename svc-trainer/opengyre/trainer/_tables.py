"""The trainer's projection tables: what it must remember between steps (and rebuild from the log)."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, Integer, LargeBinary, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.store import STREAM_SEQ, Base
from opengyre.trajectory import ENGINE_ID_LEN, FINISH_REASON_LEN

__all__ = ["CallRow", "EngineRow", "ExecutionRow", "StepRow", "WeightsRow"]


class ExecutionRow(Base):
    """One execution: dispatch facts, its outcome and verdict, and which step consumed it."""

    __tablename__ = "trainer_executions"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(128))
    group_id: Mapped[str] = mapped_column(String(128), index=True)
    group_size: Mapped[int] = mapped_column(Integer)  # 0: unknown, the trainer's default applies
    weight_version: Mapped[str] = mapped_column(String(64))
    dispatched_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    status: Mapped[str] = mapped_column(String(32))  # "running" until finished
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    verdict: Mapped[str] = mapped_column(String(16))  # pending | ok | transient | masked | excluded
    reason: Mapped[str] = mapped_column(String(64))
    n_calls: Mapped[int] = mapped_column(Integer)
    n_generated: Mapped[int] = mapped_column(Integer)
    finished_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True, index=True)
    consumed_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
    consumed_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    consumed_as: Mapped[str | None] = mapped_column(String(96), nullable=True)  # "train" or the drop reason
    compacted_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)  # its payloads were deleted
    # The proxy's count of its calls, from the finish (None: not sealed; late calls are accepted until consumed).
    recorded_calls: Mapped[int | None] = mapped_column(Integer, nullable=True)


class CallRow(Base):
    """One model call (a trajectory-tree node): its token delta, output and behaviour logprobs, inline or (as the
    proxy records them) by reference to the payload stored once, which the trainer reads when it builds a step."""

    __tablename__ = "trainer_calls"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer)  # arrival order within the execution: parents come first
    parent_call_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    prefix_len: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)  # prompt + output: what a child's prefix_len may reach
    n_prompt_delta: Mapped[int] = mapped_column(Integer)
    n_output: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(32))
    weight_version: Mapped[str] = mapped_column(String(64))
    # Inline calls only (empty when the tokens are in the payload store):
    prompt_delta: Mapped[bytes] = mapped_column(LargeBinary)  # int32 little-endian
    output_ids: Mapped[bytes] = mapped_column(LargeBinary)  # int32 little-endian
    output_logprobs: Mapped[bytes] = mapped_column(LargeBinary)  # float32 little-endian
    payload_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    payload_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    compacted_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)
    seq: Mapped[int] = mapped_column(STREAM_SEQ)
    # JSON [[version, start, end], ...] when the weights changed during the call ("" when they did not)
    weight_spans: Mapped[str] = mapped_column(Text, server_default="")
    # The sampling temperature of the recorded logprobs (None: unknown, never trained) and why the call ended.
    temperature: Mapped[float | None] = mapped_column(Float, nullable=True)
    finish_reason: Mapped[str] = mapped_column(String(FINISH_REASON_LEN), server_default="")
    engine_id: Mapped[str] = mapped_column(String(ENGINE_ID_LEN), server_default="")  # the proxy's engines, ","-joined


class StepRow(Base):
    __tablename__ = "trainer_steps"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    weight_version: Mapped[str] = mapped_column(String(64))
    loss: Mapped[float] = mapped_column(Float)
    n_samples: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    n_trained: Mapped[int] = mapped_column(Integer)
    n_dropped: Mapped[int] = mapped_column(Integer)
    staleness_mean: Mapped[float] = mapped_column(Float)
    staleness_max: Mapped[int] = mapped_column(Integer)
    grad_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    reward_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    seq: Mapped[int] = mapped_column(STREAM_SEQ)


class WeightsRow(Base):
    __tablename__ = "trainer_weights"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight_version: Mapped[str] = mapped_column(String(64), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(String(1024))
    digest: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(STREAM_SEQ)


class EngineRow(Base):
    """A cell's engine as the scheduler announced it: the trainer reloads rollout engines after each step."""

    __tablename__ = "trainer_engines"

    cell_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    engine_url: Mapped[str | None] = mapped_column(String(255), nullable=True)
    role: Mapped[str] = mapped_column(String(32))
    seq: Mapped[int] = mapped_column(STREAM_SEQ)
    resident: Mapped[bool] = mapped_column(Boolean, server_default=false())  # never trains (the cell's rule)
