"""Folding a run straight from an event log: a sequence range of typed reads, nothing else."""

from __future__ import annotations

from ..eventlog import EventLogProtocol
from ._fold import FOLDED_TYPES, RunFold
from ._model import RunSummary

__all__ = ["fold_log", "summarize"]


async def fold_log(
    log: EventLogProtocol, fold: RunFold | None = None, *, start_seq: int = 1, end_seq: int | None = None
) -> RunFold:
    """Fold the events a report reads with ``start_seq <= seq <= end_seq`` (default: the log's end now) into
    ``fold`` (a new one by default). Only the subjects of the folded types' aggregates are read."""
    fold = fold if fold is not None else RunFold()
    async for seq, event in log.events(*FOLDED_TYPES, start_seq=start_seq, end_seq=end_seq):
        fold.apply(seq, event)
    return fold


async def summarize(log: EventLogProtocol, *, start_seq: int = 1, end_seq: int | None = None) -> RunSummary:
    """The :class:`RunSummary` of the log's events in ``[start_seq, end_seq]``."""
    return (await fold_log(log, start_seq=start_seq, end_seq=end_seq)).summary()
