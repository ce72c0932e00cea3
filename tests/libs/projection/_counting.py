"""A deliberately non-idempotent test projection: applying an event twice would double a counter."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Column, Connection, Float, Integer, MetaData, String, Table, insert, select, update
from sqlalchemy.exc import OperationalError

from opengyre.events import Event, ExecutionDispatched, ExecutionFinished
from opengyre.projection import Projection, Rejected

metadata = MetaData()
counts = Table(
    "test_counts",
    metadata,
    Column("aggregate_id", String(128), primary_key=True),
    Column("n", Integer, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("score_sum", Float, nullable=False),
)


class CountingProjection(Projection):
    name = "test-counting"

    def __init__(self, fail_first: int = 0) -> None:
        # Raise a transient store error on the first ``fail_first`` applies (a locked database, say).
        self.fail_first = fail_first

    @property
    def tables(self) -> Sequence[Table]:
        return (counts,)

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise OperationalError("UPDATE test_counts", {}, Exception("database is locked"))
        if isinstance(event, ExecutionFinished) and event.detail == "poison":
            raise Rejected(f"execution {event.execution_id} is poison")
        key = event.aggregate_id()
        score = event.score or 0.0 if isinstance(event, ExecutionFinished) else 0.0
        row = tx.execute(select(counts.c.n, counts.c.score_sum).where(counts.c.aggregate_id == key)).first()
        if row is None:
            tx.execute(insert(counts).values(aggregate_id=key, n=1, last_seq=seq, score_sum=score))
        else:
            tx.execute(
                update(counts)
                .where(counts.c.aggregate_id == key)
                .values(n=row.n + 1, last_seq=seq, score_sum=row.score_sum + score)
            )


def sample_events(n_exec: int) -> list[Event]:
    out: list[Event] = []
    for i in range(n_exec):
        out.append(ExecutionDispatched(execution_id=f"e{i % 97}", task_id="t", group_id=f"g{i % 7}"))
        if i % 2:
            out.append(ExecutionFinished(execution_id=f"e{i % 97}", status="completed", score=(i % 10) / 10))
    return out
