"""The proxy's trajectory store and the trainer's store fold recorded calls by one set of rules and one codec
(``opengyre.trajectory``): they refuse the same calls with the same reasons and keep logprobs as float32 both."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, delete, select

from opengyre.events import ExecutionDispatched, ModelCallRecorded, PayloadRef, WeightSpan
from opengyre.projection import Projection, Rejected
from opengyre.proxy import TrajectoryProjection
from opengyre.trainer import TrainerProjection


def _call(cid: str, **kw: Any) -> ModelCallRecorded:
    base: dict[str, Any] = dict(
        execution_id="x", call_id=cid, prompt_delta_ids=[1, 2], output_ids=[3, 4], output_logprobs=[-0.1, -2.3]
    )
    base.update(kw)
    return ModelCallRecorded(**base)


CALLS = [
    _call("c0"),
    _call("c1", parent_call_id="c0", prefix_len=4),
    _call("k1", output_logprobs=[-0.5]),
    _call("k2", parent_call_id="nope", prefix_len=1),
    _call("k3", parent_call_id="c0", prefix_len=5),
    _call("k4", prefix_len=3),
    _call("k5", output_logprobs=[-0.5, 0.7]),
    _call("k6", output_logprobs=[-0.5, float("nan")]),
    _call("k7", output_ids=[3, -4]),
    _call("k8", prefix_len=-1),
    _call("k9", weight_versions=[WeightSpan(version="v2", start=1, end=3)]),
    _call("c0"),
    _call("k10", payload=PayloadRef(digest="d", size=10, prompt_delta=2, output=2)),  # tokens inline too
    _call("k11", prompt_delta_ids=[], output_ids=[], output_logprobs=[], context={"a": 1},
          payload=PayloadRef(digest="d", size=10, prompt_delta=2, output=2)),  # context inline too
    _call("k12", prompt_delta_ids=[], output_ids=[], output_logprobs=[],
          payload=PayloadRef(digest="d", size=-1, prompt_delta=2, output=2)),
]  # fmt: skip


def _fold(engine: Engine, projection: Projection) -> list[str]:
    outcomes: list[str] = []
    with engine.begin() as tx:
        for t in projection.tables:
            tx.execute(delete(t))
        projection.apply(tx, ExecutionDispatched(execution_id="x", task_id="t", group_id="g"), 1)
        for seq, e in enumerate(CALLS, 2):
            try:
                with tx.begin_nested():
                    projection.apply(tx, e, seq)
                outcomes.append("ok")
            except Rejected as exc:
                outcomes.append(exc.reason)
    return outcomes


def test_both_stores_refuse_the_same_calls_for_the_same_reasons(engine: Engine) -> None:
    proxy, trainer = _fold(engine, TrajectoryProjection()), _fold(engine, TrainerProjection())
    assert proxy == trainer
    assert proxy == [
        "ok", "ok", "length-mismatch", "unknown-parent", "bad-prefix", "bad-prefix", "corrupt-logprobs",
        "corrupt-logprobs", "corrupt-tokens", "bad-prefix", "bad-weight-spans", "duplicate-call",
        "ambiguous-tokens", "ambiguous-tokens", "bad-payload-ref",
    ]  # fmt: skip


def _stored_logprobs(tx: Connection, projection: Projection) -> bytes:
    calls = projection.tables[0]
    return bytes(tx.execute(select(calls.c.output_logprobs).where(calls.c.call_id == "c0")).scalar_one())


def test_both_stores_keep_logprobs_as_float32(engine: Engine) -> None:
    for projection in (TrajectoryProjection(), TrainerProjection()):
        _fold(engine, projection)
        with engine.connect() as tx:
            raw = _stored_logprobs(tx, projection)
        assert raw == np.asarray([-0.1, -2.3], dtype="<f4").tobytes(), type(projection).__name__
