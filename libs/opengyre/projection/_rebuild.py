"""Rebuild a projection from sequence 1, or replay it as of any point into another store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, Table, select

from ..eventlog import EventLog
from ._apply import FoldTransaction
from ._base import Projection
from ._runner import ProjectionRunner
from ._stream import StreamMismatch, check_stream

__all__ = ["dump_rows", "rebuild", "replay_into"]


async def replay_into(
    projection: Projection, log: EventLog, engine: Engine, *, until_seq: int | None = None, batch: int = 4096
) -> int:
    """Fold the log's events ``1..until_seq`` into ``engine`` (which must be migrated and empty for it).

    Goes on from the projection's position there; raises :class:`StreamMismatch` if that position counts in
    another stream than the log's (see ``_stream``).
    """
    fold = FoldTransaction(projection, engine, log.registry)
    _, why = await check_stream(fold, log)
    if why is not None:
        raise StreamMismatch(why)
    n = 0
    start = await asyncio.to_thread(fold.position) + 1
    filters = None
    if projection.aggregates:
        filters = [log.config.aggregate_filter(a) for a in projection.aggregates]
    async for msgs in log.read_batches(start, until_seq, subjects=filters, batch=batch):
        stored = await log.to_stored_many(msgs)
        await asyncio.to_thread(fold.fold, stored)
        n += len(stored)
    return n


async def rebuild(projection: Projection, log: EventLog, engine: Engine) -> int:
    """Drop the projection's rows and replay the whole log; its durable consumer then resumes after.

    Stop the projection's live runner first: a rebuild owns the projection while it runs. This is also how a
    projection that refuses the log's stream (re-created, or ending before its position) is made to fold it.
    """
    runner = ProjectionRunner(projection, log, engine)
    await runner.delete_consumer()
    fold = FoldTransaction(projection, engine, log.registry)
    await asyncio.to_thread(fold.reset)
    n = await replay_into(projection, log, engine)
    await runner.ensure_consumer()
    return n


def dump_rows(engine: Engine, tables: Sequence[Table]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the given tables, ordered by primary key: the thing a rebuild must reproduce exactly."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in tables:
            order = list(table.primary_key.columns) or list(table.columns)
            out[table.name] = [tuple(r) for r in conn.execute(select(table).order_by(*order))]
    return out
