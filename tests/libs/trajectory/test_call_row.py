"""One row for a recorded call: both call stores (the proxy's trajectories, the trainer's calls) write the columns
they share from ``call_row``, so they agree, and a finish reason or engine list too long for its column is cut
to the column's width in both (it was cut in the trainer's only)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Table, select

from opengyre.events import ExecutionDispatched, ModelCallRecorded, WeightSpan
from opengyre.projection import Projection
from opengyre.proxy import TrajectoryProjection
from opengyre.trainer import TrainerProjection
from opengyre.trajectory import ENGINE_ID_LEN, FINISH_REASON_LEN, call_row

CALL = ModelCallRecorded(
    execution_id="x",
    call_id="c0",
    prompt_delta_ids=[1, 2, 3],
    output_ids=[4, 5],
    output_logprobs=[-0.5, -1.5],
    weight_version="v1",
    weight_versions=[WeightSpan(version="v1", start=0, end=2)],
    temperature=0.7,
    finish_reason="an engine's own finish reason, longer than any column keeps",
    engine_id=",".join(f"cell-{i:03d}" for i in range(40)),  # a call rerouted across many engines
)


def test_the_row_cuts_free_text_to_the_columns_width() -> None:
    row = call_row(CALL, 7)
    assert len(CALL.finish_reason) > FINISH_REASON_LEN and len(CALL.engine_id) > ENGINE_ID_LEN
    assert row["finish_reason"] == CALL.finish_reason[:FINISH_REASON_LEN]
    assert row["engine_id"] == CALL.engine_id[:ENGINE_ID_LEN]
    assert (row["seq"], row["n_tokens"], row["prefix_len"]) == (7, 5, 0)


def _stored(engine: Engine, projection: Projection, table: str) -> dict[str, Any]:
    with engine.begin() as tx:
        projection.apply(tx, ExecutionDispatched(execution_id="x", task_id="t", group_id="g"), 1)
        projection.apply(tx, CALL, 2)
    (t,) = [t for t in projection.tables if t.name == table]
    assert isinstance(t, Table)
    with engine.connect() as c:
        (row,) = c.execute(select(t)).mappings().all()
    return dict(row)


def test_both_call_stores_keep_the_same_shared_columns(engine: Engine) -> None:
    proxy = _stored(engine, TrajectoryProjection(), "proxy_calls")
    trainer = _stored(engine, TrainerProjection(), "trainer_calls")
    shared = call_row(CALL, 2)
    proxy["weight_spans"] = proxy.pop("weight_versions")  # the proxy's name for the column
    assert {k: proxy[k] for k in shared} == shared
    assert {k: trainer[k] for k in shared} == shared
