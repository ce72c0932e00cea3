"""Projections: pure folds of the event log into SQL views, with exactly-once application."""

from ._apply import BatchOutcome, FoldTransaction, TransientError
from ._base import Projection, Rejected, folds
from ._rebuild import dump_rows, rebuild, replay_into
from ._runner import ProjectionRunner, ProjectionStatus, RunnerStopped, consumer_name
from ._stream import StreamMismatch

__all__ = [
    "BatchOutcome",
    "FoldTransaction",
    "Projection",
    "ProjectionRunner",
    "ProjectionStatus",
    "Rejected",
    "RunnerStopped",
    "StreamMismatch",
    "TransientError",
    "consumer_name",
    "dump_rows",
    "folds",
    "rebuild",
    "replay_into",
]
