"""Workload files: a workload as data (TOML), so a user can bring their own, fitted or recorded.

A file describes the durations (a parametric model, or recorded groups resampled as they were), and
optionally the model whose facts set the costs, the published run the simulator's unpublished knobs are
derived from, and GPU assumptions. Every section may list which of its fields are ``assumed`` (not published);
reports carry that list. The loader refuses unknown sections and fields, missing ones and bad values, and
never fills a missing value in.

    [workload]
    name = "nl2repo-122b"
    source = "QwenGyre (arXiv 2609.33848), Qwen3.6-122B on NL2RepoBench"
    group_size = 16
    timeout_h = 6.0
    assumed = ["timeout_h"]

    [workload.published]          # the statistics the durations were fitted to (optional)
    mean_execution_h = 1.93

    [workload.durations]          # kind = "weibull-lognormal" (scale_h, shape, sigma_task) or
    kind = "weibull-lognormal"    # kind = "empirical" (groups_h: one list of hours per group)
    scale_h = 2.1529
    shape = 3.5068
    sigma_task = 0.2248

    [model]                       # ModelFacts fields, optional
    [run]                         # the paper's elastic run: cells, nodes_per_cell, gpus_per_node, steps, hours,
                                  # groups_per_step (optional)
    [gpu]                         # GpuFacts fields, optional (defaults are assumptions, and say so)
    [knobs]                       # optional: slots_per_cell, micro_step_s, gpus_per_cell (the cell they are
                                  # for) and why: fixed knobs instead of the ones derived from [run]
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from ._costs import GpuFacts, ModelFacts
from ._workload import DurationModel, Durations, EmpiricalDurations

__all__ = [
    "FixedKnobs",
    "PublishedRun",
    "WorkloadFile",
    "WorkloadFileError",
    "dump_workload",
    "load_workload",
    "shipped_workload",
]

HOUR = 3600.0
SHIPPED = Path(__file__).parent / "workloads"


class WorkloadFileError(ValueError):
    """The file is not a workload this simulator can run: says which field and why."""


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """The paper's elastic run on this workload: what the unpublished knobs are derived from."""

    cells: int
    nodes_per_cell: int
    gpus_per_node: int
    steps: int
    hours: float  # its wall time for ``steps``
    groups_per_step: int

    @property
    def gpus_per_cell(self) -> int:
        return self.nodes_per_cell * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class FixedKnobs:
    """Slots per cell and micro-step set by hand (not derived from the published run), and why."""

    slots_per_cell: int
    micro_step_s: float  # one group on a cell of ``gpus_per_cell`` GPUs
    gpus_per_cell: int
    why: str


@dataclass(frozen=True)
class WorkloadFile:
    name: str
    source: str
    durations: Durations
    published: dict[str, float] = field(default_factory=dict)
    model: ModelFacts | None = None
    run: PublishedRun | None = None
    gpu: GpuFacts = field(default_factory=GpuFacts)
    assumed: dict[str, list[str]] = field(default_factory=dict)  # section -> its fields that are assumptions
    knobs: FixedKnobs | None = None  # None: derive them from ``run`` (``sim.derive_knobs``)


def _take(section: dict[str, Any], where: str, spec: Mapping[str, type]) -> dict[str, Any]:
    """The section's fields by ``spec`` (name -> type), refusing unknown, missing and mistyped ones."""
    extra = set(section) - set(spec) - {"assumed"}
    if extra:
        raise WorkloadFileError(f"[{where}]: unknown field(s) {', '.join(sorted(extra))}; known: {', '.join(spec)}")
    out: dict[str, Any] = {}
    for name, kind in spec.items():
        if name not in section:
            raise WorkloadFileError(f"[{where}]: {name} is missing")
        v = section[name]
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise WorkloadFileError(f"[{where}]: {name} must be {kind.__name__}, not {v!r}")
        out[name] = v
    return out


def _assumed(section: dict[str, Any], where: str, allowed: set[str]) -> list[str]:
    names = section.get("assumed", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise WorkloadFileError(f"[{where}]: assumed must be a list of field names")
    bad = set(names) - allowed
    if bad:
        raise WorkloadFileError(f"[{where}]: assumed names unknown field(s) {', '.join(sorted(bad))}")
    return list(names)


_MODEL: dict[str, type] = {
    f.name: (str if f.name == "name" else int if f.type == "int" else float) for f in fields(ModelFacts)
}
_RUN: dict[str, type] = {f.name: (float if f.type == "float" else int) for f in fields(PublishedRun)}
_GPU: dict[str, type] = {f.name: float for f in fields(GpuFacts)}
_KNOBS: dict[str, type] = {"slots_per_cell": int, "micro_step_s": float, "gpus_per_cell": int, "why": str}
_PUBLISHED = {"mean_execution_h", "mean_query_h", "share_queries_over", "share_complete_queries_over", "over_h"}


def load_workload(path: Path) -> WorkloadFile:
    """Read and check a workload file (see the module doc)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WorkloadFileError(f"{path}: {exc}") from exc
    try:
        return _parse(doc)
    except WorkloadFileError as exc:
        raise WorkloadFileError(f"{path}: {exc}") from exc


def _parse(doc: dict[str, Any]) -> WorkloadFile:
    extra = set(doc) - {"workload", "model", "run", "gpu", "knobs"}
    if extra:
        raise WorkloadFileError(
            f"unknown section(s) {', '.join(sorted(extra))}; known: workload, model, run, gpu, knobs"
        )
    if "workload" not in doc:
        raise WorkloadFileError("[workload] is missing")
    w = dict(doc["workload"])
    published = w.pop("published", {})
    dur = w.pop("durations", None)
    if dur is None:
        raise WorkloadFileError("[workload.durations] is missing")
    head = _take(w, "workload", {"name": str, "source": str, "group_size": int, "timeout_h": float})
    assumed = {"workload": _assumed(w, "workload", {"source", "group_size", "timeout_h"})}
    if head["group_size"] < 1 or head["timeout_h"] <= 0:
        raise WorkloadFileError("[workload]: group_size must be >= 1 and timeout_h > 0")
    bad = set(published) - _PUBLISHED
    if bad:
        raise WorkloadFileError(f"[workload.published]: unknown field(s) {', '.join(sorted(bad))}")
    timeout_s = head["timeout_h"] * HOUR
    durations: Durations
    kind = dur.get("kind")
    if kind == "weibull-lognormal":
        p = _take({k: v for k, v in dur.items() if k != "kind"}, "workload.durations",
                  {"scale_h": float, "shape": float, "sigma_task": float})  # fmt: skip
        model = DurationModel(head["name"], p["scale_h"], p["shape"], p["sigma_task"], timeout_s, head["group_size"])
        try:
            model.validate()
        except ValueError as exc:
            raise WorkloadFileError(f"[workload.durations]: {exc}") from exc
        durations = model
    elif kind == "empirical":
        p = _take({k: v for k, v in dur.items() if k != "kind"}, "workload.durations", {"groups_h": list})
        rows = p["groups_h"]
        if not all(isinstance(r, list) and len(r) == head["group_size"] for r in rows):
            raise WorkloadFileError(f"[workload.durations]: groups_h needs lists of group_size={head['group_size']}")
        try:
            durations = EmpiricalDurations(
                head["name"], tuple(tuple(float(x) * HOUR for x in r) for r in rows), timeout_s
            )
        except (TypeError, ValueError) as exc:
            raise WorkloadFileError(f"[workload.durations]: {exc}") from exc
    else:
        raise WorkloadFileError(f"[workload.durations]: kind must be weibull-lognormal or empirical, not {kind!r}")
    out: dict[str, Any] = {}
    if "model" in doc:
        m = _take(doc["model"], "model", _MODEL)
        assumed["model"] = _assumed(doc["model"], "model", set(_MODEL))
        out["model"] = ModelFacts(**m)
        try:
            out["model"].validate()
        except ValueError as exc:
            raise WorkloadFileError(f"[model]: {exc}") from exc
    if "run" in doc:
        r = _take(doc["run"], "run", _RUN)
        assumed["run"] = _assumed(doc["run"], "run", set(_RUN))
        if min(r["cells"], r["nodes_per_cell"], r["gpus_per_node"], r["steps"], r["groups_per_step"]) < 1 or (
            r["hours"] <= 0
        ):
            raise WorkloadFileError("[run]: counts must be >= 1 and hours > 0")
        out["run"] = PublishedRun(**r)
    if "gpu" in doc:
        g = _take(doc["gpu"], "gpu", _GPU)
        assumed["gpu"] = _assumed(doc["gpu"], "gpu", set(_GPU))
        out["gpu"] = GpuFacts(**g)
        try:
            out["gpu"].validate()
        except ValueError as exc:
            raise WorkloadFileError(f"[gpu]: {exc}") from exc
    else:
        assumed["gpu"] = [f.name for f in fields(GpuFacts)]  # the defaults are assumptions
    if "knobs" in doc:
        k = _take(doc["knobs"], "knobs", _KNOBS)
        if "assumed" in doc["knobs"]:
            raise WorkloadFileError("[knobs]: fixed knobs are set by hand, not published: say why instead")
        if k["slots_per_cell"] < 1 or k["micro_step_s"] <= 0 or k["gpus_per_cell"] < 1 or not k["why"].strip():
            raise WorkloadFileError("[knobs]: slots_per_cell, gpus_per_cell >= 1, micro_step_s > 0 and a why")
        out["knobs"] = FixedKnobs(**k)
    return WorkloadFile(head["name"], head["source"], durations, dict(published), assumed=assumed, **out)


def dump_workload(wf: WorkloadFile, path: Path) -> Path:
    """Write ``wf`` in the file format (``load_workload`` reads back an equal workload)."""
    d = wf.durations
    dur: dict[str, Any]
    if isinstance(d, DurationModel):
        dur = {"kind": "weibull-lognormal", "scale_h": d.scale_h, "shape": d.shape, "sigma_task": d.sigma_task}
    elif isinstance(d, EmpiricalDurations):
        dur = {"kind": "empirical", "groups_h": [[x / HOUR for x in g] for g in d.groups]}
    else:
        raise WorkloadFileError(f"cannot write durations of type {type(d).__name__}")
    w: dict[str, Any] = {"name": wf.name, "source": wf.source, "group_size": d.group_size,
                         "timeout_h": d.timeout_s / HOUR}  # fmt: skip
    if wf.assumed.get("workload"):
        w["assumed"] = wf.assumed["workload"]
    if wf.published:
        w["published"] = dict(wf.published)
    w["durations"] = dur
    doc: dict[str, Any] = {"workload": w}
    for name, obj in (("model", wf.model), ("run", wf.run), ("gpu", wf.gpu), ("knobs", wf.knobs)):
        if obj is None:
            continue
        sec = {f.name: getattr(obj, f.name) for f in fields(obj)}
        if wf.assumed.get(name):
            sec["assumed"] = wf.assumed[name]
        doc[name] = sec
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(doc))
    return path


def shipped_workload(name: str) -> WorkloadFile:
    """A workload file shipped with the simulator (``workloads/<name>.toml``)."""
    path = SHIPPED / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in SHIPPED.glob("*.toml"))
        raise WorkloadFileError(f"no shipped workload {name!r}; shipped: {', '.join(known)}")
    return load_workload(path)
