"""Each execution's size from the proxy's trajectory store: a call whose tokens are in the payload store counts
as many tokens as the same call recorded inline (its row's token columns are empty; only the lengths say)."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, select

from opengyre.events import ModelCallRecorded
from opengyre.proxy import TrajectoryProjection
from opengyre.proxy.recording._store import CALLS
from opengyre.trajectory import ExecutionSize, execution_sizes, split_payload


def _calls(execution_id: str) -> list[ModelCallRecorded]:
    root = ModelCallRecorded(execution_id=execution_id, call_id="a", prompt_delta_ids=[1] * 90, output_ids=[2] * 10,
                             output_logprobs=[-0.5] * 10)  # fmt: skip
    child = ModelCallRecorded(execution_id=execution_id, call_id="b", parent_call_id="a", prefix_len=100,
                              prompt_delta_ids=[3] * 40, output_ids=[4] * 20, output_logprobs=[-0.5] * 20)  # fmt: skip
    return [root, child]


def test_a_call_stored_by_payload_counts_as_the_same_call_inline(engine: Engine) -> None:
    projection = TrajectoryProjection()
    events = [*_calls("inline"), *(split_payload(e)[0] for e in _calls("by-payload"))]
    with engine.begin() as tx:
        for seq, e in enumerate(events, 1):
            projection.apply(tx, e, seq)
    with engine.connect() as conn:
        # The payload calls' rows hold no token ids: counting those would see only the child's prefix.
        empty = conn.execute(select(CALLS.c.output_ids).where(CALLS.c.execution_id == "by-payload")).scalars().all()
        assert empty == [b"", b""]
        sizes = execution_sizes(conn)
    assert sizes == [ExecutionSize("inline", 160, 160), ExecutionSize("by-payload", 160, 160)]


def test_a_database_without_the_trajectory_store_has_no_sizes() -> None:
    eng = create_engine("sqlite://")
    with eng.connect() as conn:
        assert execution_sizes(conn) == []
    eng.dispose()
