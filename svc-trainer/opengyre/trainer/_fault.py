"""A test seam: a process that kills itself (SIGKILL) at a named point of the training step.

``OPENGYRE_FAULT=<point>`` in a trainer's environment makes ``fault(point)`` end the process there, as a power
cut or the OOM killer would: no ``finally``, no flush, no goodbye. It lets a test crash a step *during* its work
(after the optimizer moved the weights, between the checkpoint and the events, between the step's two events)
instead of at whatever quiet moment an outside kill happens to land. Unset, it costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "FAULT_POINTS", "fault"]

FAULT_ENV = "OPENGYRE_FAULT"

# In the order a step reaches them.
FAULT_POINTS = (
    "trainer.step.after-optimizer",  # the weights moved in memory; no checkpoint, no event
    "trainer.publish.after-write",  # the checkpoint is whole on disk; no event
    "trainer.publish.after-completed",  # TrainingStepCompleted appended (executions consumed); no WeightsPublished
    "trainer.publish.after-published",  # both events appended; the engines not yet asked to reload
)


def fault(point: str) -> None:
    """SIGKILL this process if ``$OPENGYRE_FAULT`` names ``point``."""
    if point not in FAULT_POINTS:  # a typo in the code would otherwise make a test pass without a crash
        raise ValueError(f"unknown fault point {point!r}")
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
