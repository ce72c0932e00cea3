"""A simulation of a workload file's run: the published cluster and loop, the unpublished knobs derived (or
given), the model's move costs. The CLI and the benchmark build their configurations here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._policy import LoopConfig
from ._config import ClusterConfig, CostConfig, SimConfig
from ._costs import MoveCost, MoveMode
from ._derive import DerivedKnobs, derive_knobs
from ._files import WorkloadFile
from ._measured import MeasuredMoves

__all__ = ["Setup", "setup"]


@dataclass(frozen=True)
class Setup:
    config: SimConfig
    knobs: DerivedKnobs | None
    notes: list[str] = field(default_factory=list)  # where each knob came from


def setup(
    wf: WorkloadFile,
    *,
    steps: int | None = None,
    groups_per_step: int | None = None,
    max_lag: int = 1,
    micro_splits: int = 1,
    cells: int | None = None,
    nodes_per_cell: int | None = None,
    gpus_per_node: int | None = None,
    slots_per_cell: int | None = None,
    micro_step_s: float | None = None,
    resident_cells: int = 0,
    cell_gpus: tuple[int, ...] = (),
    step_overhead_s: float = 60.0,
    move: MoveMode = "re-prefill",
    measured: MeasuredMoves | None = None,
    seed: int = 0,
) -> Setup:
    """The configuration for ``wf``; raises ValueError naming what is missing (nothing is made up).

    ``measured``: the move costs' efficiencies come from a measurement of the built engine (``sim._measured``),
    applied to the workload's GPU facts; the knobs are still derived with the workload's own."""
    run, notes = wf.run, []

    def pick(name: str, given: int | None, published: int | None) -> int:
        if given is not None:
            return given
        if published is None:
            raise ValueError(f"{name} is not in workload {wf.name} (no [run] section): give it")
        return published

    cells_ = pick("cells", cells, run.cells if run else None)
    nodes = pick("nodes_per_cell", nodes_per_cell, run.nodes_per_cell if run else None)
    gpn = pick("gpus_per_node", gpus_per_node, run.gpus_per_node if run else None)
    gps = pick("groups_per_step", groups_per_step, run.groups_per_step if run else None)
    steps_ = pick("steps", steps, run.steps if run else None)
    knobs = None
    given_slots, given_micro = slots_per_cell is not None, micro_step_s is not None
    fixed = wf.knobs
    if fixed is not None:  # the file sets them by hand: scaled to this cell like derived ones, and said so
        cell = nodes * gpn
        if slots_per_cell is None:
            slots_per_cell = max(1, round(fixed.slots_per_cell * cell / fixed.gpus_per_cell))
            notes.append(f"from the file: {slots_per_cell} slots per cell ({fixed.why})")
        if micro_step_s is None:
            micro_step_s = fixed.micro_step_s * fixed.gpus_per_cell / cell
            notes.append(f"from the file: micro-step {micro_step_s:g} s on {cell} GPUs ({fixed.why})")
    if slots_per_cell is None or micro_step_s is None:
        if run is None or wf.model is None:
            raise ValueError(
                f"slots per cell and the micro-step are not published; workload {wf.name} has no [run] and [model] "
                "to derive them from: give --slots-per-cell and --micro-step-s"
            )
        knobs = derive_knobs(run, wf.model, wf.gpu, wf.durations)
        notes.append("derived: " + knobs.explain())
    reference = knobs.gpus_per_cell if knobs else nodes * gpn
    if slots_per_cell is None:
        assert knobs is not None
        # The same GPUs per execution on cells of another size.
        slots = max(1, round(knobs.slots_per_cell * nodes * gpn / knobs.gpus_per_cell))
    else:
        slots = slots_per_cell
        if given_slots:
            notes.append(f"given: {slots} slots per cell")
    if micro_step_s is None:
        assert knobs is not None
        micro = knobs.micro_step_s
    else:
        micro = micro_step_s
        if given_micro:
            notes.append(f"given: micro-step {micro:g} s on {reference} GPUs")
    if move != "free" and wf.model is None:
        raise ValueError(
            f"move cost {move} needs the model's facts; workload {wf.name} has no [model]: use --move free"
        )
    move_gpu = wf.gpu
    if measured is not None:
        move_gpu = measured.scaled(wf.gpu)
        notes.append(measured.explain(wf.gpu))
    cfg = SimConfig(
        loop=LoopConfig(steps=steps_, groups_per_step=gps, group_size=wf.durations.group_size, max_lag=max_lag,
                        micro_splits=micro_splits),
        cluster=ClusterConfig(cells=cells_, nodes_per_cell=nodes, gpus_per_node=gpn, slots_per_cell=slots,
                              resident_cells=resident_cells, cell_gpus=cell_gpus),
        costs=CostConfig(micro_step_s=micro, reference_gpus=reference, step_overhead_s=step_overhead_s,
                         move=MoveCost(move, wf.model, move_gpu)),
        workload=wf.durations,
        seed=seed,
    )  # fmt: skip
    cfg.validate()
    return Setup(cfg, knobs, notes)
