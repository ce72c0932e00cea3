"""The simulator's two unpublished knobs, derived from published facts instead of chosen.

* **Micro-step length** (one group, forward and backward, on one cell): 6 FLOPs per active parameter and
  trained token, for ``group_size`` executions of ``trained_tokens`` each, at the GPUs' sustained rate:
  ``6 * active_params * trained_tokens * group_size / (gpus_per_cell * flops * mfu)``.
* **Slots per cell** (executions a rollout cell holds at once): the published run trains ``steps`` steps in
  ``hours``. At that pace each step's training takes ``groups_per_step`` micro-steps of a cell's GPUs; the
  rest of the cluster's GPU-time must roll out a step's executions (``groups_per_step * group_size``, each
  lasting the workload's mean execution). Assuming the run wasted nothing (its time is the work bound), that
  fixes the GPUs behind one execution, hence the slots of a cell. A run that wasted some GPU-time needs more
  slots: this is the smallest count consistent with the published time.

Neither uses the ratios the simulator is later compared on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._costs import GpuFacts, ModelFacts
from ._files import PublishedRun
from ._workload import Durations

__all__ = ["DerivedKnobs", "derive_knobs"]

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class DerivedKnobs:
    micro_step_s: float  # one group on one cell of ``gpus_per_cell`` GPUs
    slots_per_cell: int
    gpus_per_cell: int
    step_s: float  # the published run's time per step
    training_share: float  # of the cluster's GPU-time at that pace
    mean_execution_h: float
    gpus_per_execution: float

    def explain(self) -> str:
        return (
            f"micro-step {self.micro_step_s:.1f} s per group on a {self.gpus_per_cell}-GPU cell (6 x active "
            f"parameters x trained tokens); {self.slots_per_cell} slots per cell: the published run's "
            f"{self.step_s / 60:.1f} min per step leaves {1 - self.training_share:.1%} of the GPU-time to roll out "
            f"a step's executions of {self.mean_execution_h:.2f} h each, {self.gpus_per_execution:.4f} GPUs per "
            "execution (no GPU-time wasted: the fewest slots that fit the published time)"
        )


def derive_knobs(run: PublishedRun, model: ModelFacts, gpu: GpuFacts, durations: Durations) -> DerivedKnobs:
    gpc = run.gpus_per_cell
    micro = model.train_flops(durations.group_size) / (gpc * gpu.flops * gpu.mfu)
    step_s = run.hours * HOUR / run.steps
    cluster = run.cells * gpc * step_s
    training = run.groups_per_step * micro * gpc
    if training >= cluster:
        raise ValueError(
            f"the published {run.hours:g} h for {run.steps} steps cannot hold this training cost: a step's "
            f"{run.groups_per_step} micro-steps of {micro:.0f} s take {training / cluster:.0%} of the cluster"
        )
    mean_s = float(durations.sample(np.random.default_rng(11), 20_000).mean())
    slot_s = run.groups_per_step * durations.group_size * mean_s
    per_exec = (cluster - training) / slot_s
    return DerivedKnobs(
        micro_step_s=micro,
        slots_per_cell=max(1, round(gpc / per_exec)),
        gpus_per_cell=gpc,
        step_s=step_s,
        training_share=training / cluster,
        mean_execution_h=mean_s / HOUR,
        gpus_per_execution=per_exec,
    )
