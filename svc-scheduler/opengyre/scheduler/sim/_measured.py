"""Move costs from a measurement of the built engine, scaled to a workload's GPUs by a stated rule.

``svc-scheduler/bench/move_costs.py`` measures, on the CPU engine, what moving an execution costs both ways:
re-prefilling its context on the new engine, or exporting its KV cache from the old one and importing it into
the new one (``/og/kv/export``, ``/og/kv/import``). In the same process it measures the machine's own dense
GEMM rate and memory-copy bandwidth. It writes a measurement file (TOML):

    [measured]
    source = "..."                # the command, commit, machine and load it was measured with
    model = "smollm2-135m"        # the engine's model the efficiencies below come from
    gemm_flops = 1.2e11           # the machine's dense float32 GEMM, FLOP/s (best of a few)
    copy_bytes_per_s = 5.1e9      # the machine's tensor copy, B/s (best of a few)
    prefill_efficiency = 0.41     # the engine's prefill FLOP/s (ModelFacts.prefill_flops) / gemm_flops
    kv_link_efficiency = 0.12     # export + import bytes/s (fitted slope) / copy_bytes_per_s
    kv_latency_s = 0.012          # export + import fixed cost (fitted intercept)
    [[measured.points]]           # per model and context: the CPU seconds each way (what the figures came from)
    [[measured.switches]]         # a cell's switch, rollout -> training and back, with the local actuator

**The rule** (``scaled``): efficiencies are kept, rates are the workload's. A re-prefill on the workload's GPU
runs at ``prefill_efficiency`` of its peak (in place of the assumed ``mfu`` for moves; training keeps its own);
a KV migration moves its bytes at ``kv_link_efficiency`` of the assumed link rate and pays the measured fixed
cost. Nothing in the file is fitted to a ratio the simulator is compared on.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ._costs import GpuFacts
from ._files import WorkloadFileError

__all__ = ["MeasuredMoves", "load_measured"]


@dataclass(frozen=True, slots=True)
class MeasuredMoves:
    source: str
    model: str
    gemm_flops: float
    copy_bytes_per_s: float
    prefill_efficiency: float
    kv_link_efficiency: float
    kv_latency_s: float

    def validate(self) -> None:
        if min(self.gemm_flops, self.copy_bytes_per_s) <= 0 or self.kv_latency_s < 0:
            raise ValueError(f"measured moves: rates must be > 0 and the latency >= 0: {self}")
        for name in ("prefill_efficiency", "kv_link_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"measured moves: {name} = {v} is not in (0, 1] (against the same machine's rate)")

    def scaled(self, gpu: GpuFacts) -> GpuFacts:
        """The workload's GPU facts for moves: its rates at the measured efficiencies (the rule above)."""
        return replace(
            gpu,
            mfu=self.prefill_efficiency,
            link_bytes_per_s=gpu.link_bytes_per_s * self.kv_link_efficiency,
            link_latency_s=self.kv_latency_s,
        )

    def explain(self, gpu: GpuFacts) -> str:
        g = self.scaled(gpu)
        return (
            f"moves measured on the CPU engine ({self.model}): re-prefill at {self.prefill_efficiency:.1%} of the "
            f"machine's GEMM rate -> {g.mfu:.1%} of {gpu.flops:.3g} FLOP/s; KV export+import at "
            f"{self.kv_link_efficiency:.1%} of its copy bandwidth -> {g.link_bytes_per_s:.3g} B/s of the assumed "
            f"{gpu.link_bytes_per_s:.3g}, + {g.link_latency_s:.3g} s"
        )


_RECORDS = ("points", "switches")  # what the figures were computed from, kept for the reader
_SPEC = {f.name: (str if f.name in ("source", "model") else float) for f in fields(MeasuredMoves)}


def load_measured(path: Path) -> MeasuredMoves:
    """Read and check a measurement file; unknown, missing and mistyped fields are refused."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WorkloadFileError(f"{path}: {exc}") from exc
    sec: Any = doc.get("measured")
    if set(doc) - {"measured"} or not isinstance(sec, dict):
        raise WorkloadFileError(f"{path}: one [measured] section expected")
    sec = {k: v for k, v in sec.items() if k not in _RECORDS}
    extra, missing = set(sec) - set(_SPEC), set(_SPEC) - set(sec)
    if extra or missing:
        raise WorkloadFileError(f"{path}: [measured] unknown {sorted(extra)}, missing {sorted(missing)}")
    out: dict[str, Any] = {}
    for name, kind in _SPEC.items():
        v = sec[name]
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise WorkloadFileError(f"{path}: [measured] {name} must be {kind.__name__}, not {v!r}")
        out[name] = v
    m = MeasuredMoves(**out)
    try:
        m.validate()
    except ValueError as exc:
        raise WorkloadFileError(f"{path}: {exc}") from exc
    return m
