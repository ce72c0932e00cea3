"""A projection's handlers are its registry: ``apply`` dispatches by event type through them and the types its
consumer folds are derived from them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import Connection, Table

from opengyre.events import CellRegistered, ExecutionDispatched, ExecutionFinished
from opengyre.projection import Projection, folds


class _Seen(Projection):
    name = "test-seen"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    @property
    def tables(self) -> Sequence[Table]:
        return ()

    @folds(ExecutionDispatched)
    def _dispatched(self, tx: Connection, e: ExecutionDispatched, seq: int) -> None:
        self.seen.append(("dispatched", e.execution_id, seq))

    @folds(ExecutionFinished)
    def _finished(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        self.seen.append(("finished", e.execution_id, seq))


class _Later(_Seen):
    name = "test-later"

    @folds(ExecutionFinished)
    def _finished_again(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        self.seen.append(("overridden", e.execution_id, seq))


def test_the_subscribed_types_are_the_handlers_types() -> None:
    assert _Seen.event_types == {"execution-dispatched", "execution-finished"}
    p = _Seen()
    assert p.handles("execution-finished") and not p.handles("cell-registered")


def test_apply_dispatches_to_the_handler_of_the_events_type_and_skips_others() -> None:
    p = _Seen()
    tx: Connection = None  # type: ignore[assignment]  # the handlers here write no rows
    p.apply(tx, ExecutionFinished(execution_id="x", status="completed"), 7)
    p.apply(tx, CellRegistered(cell_id="c"), 8)
    p.apply(tx, ExecutionDispatched(execution_id="x", task_id="t", group_id="g"), 9)
    assert p.seen == [("finished", "x", 7), ("dispatched", "x", 9)]


def test_a_subclass_inherits_handlers_and_may_replace_one() -> None:
    p = _Later()
    p.apply(None, ExecutionFinished(execution_id="y", status="completed"), 1)  # type: ignore[arg-type]
    assert p.seen == [("overridden", "y", 1)]
    assert _Later.event_types == _Seen.event_types


def test_two_handlers_of_one_type_in_one_class_are_refused() -> None:
    with pytest.raises(TypeError, match="two folds of ExecutionFinished"):

        class _Twice(_Seen):
            @folds(ExecutionFinished)
            def _a(self, tx: Connection, e: ExecutionFinished, seq: int) -> None: ...

            @folds(ExecutionFinished)
            def _b(self, tx: Connection, e: ExecutionFinished, seq: int) -> None: ...
