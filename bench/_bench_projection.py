"""The projection the event-log benchmark folds: per-execution counters, upserted a batch at a time."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Column, Connection, Float, Integer, MetaData, String, Table
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from opengyre.events import Event, ExecutionFinished
from opengyre.projection import Projection

metadata = MetaData()
stats = Table(
    "bench_execution_stats",
    metadata,
    Column("execution_id", String(64), primary_key=True),
    Column("events", Integer, nullable=False),
    Column("score_sum", Float, nullable=False),
    Column("last_seq", Integer, nullable=False),
)


class ExecutionStats(Projection):
    name = "bench-execution-stats"
    aggregates = ("execution",)

    @property
    def tables(self) -> Sequence[Table]:
        return (stats,)

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        self.apply_batch(tx, [(seq, event)])

    def apply_batch(self, tx: Connection, events: Sequence[tuple[int, Event]]) -> None:
        acc: dict[str, list[float]] = {}
        for seq, e in events:
            row = acc.setdefault(e.aggregate_id(), [0, 0.0, 0])
            row[0] += 1
            row[1] += e.score or 0.0 if isinstance(e, ExecutionFinished) else 0.0
            row[2] = seq
        if not acc:
            return
        ins = sqlite_insert(stats)
        tx.execute(
            ins.on_conflict_do_update(
                index_elements=[stats.c.execution_id],
                set_={
                    "events": stats.c.events + ins.excluded.events,
                    "score_sum": stats.c.score_sum + ins.excluded.score_sum,
                    "last_seq": ins.excluded.last_seq,
                },
            ),
            [{"execution_id": k, "events": v[0], "score_sum": v[1], "last_seq": v[2]} for k, v in acc.items()],
        )
