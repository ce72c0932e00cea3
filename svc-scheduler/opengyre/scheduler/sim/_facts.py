"""The shipped workloads' facts as constants: NL2RepoBench on Qwen3.6-122B, read from its workload file
(``workloads/nl2repo-122b.toml``), which says what is published and what is assumed."""

from __future__ import annotations

import functools

from ._costs import ModelFacts
from ._derive import DerivedKnobs, derive_knobs
from ._files import PublishedRun, shipped_workload
from ._workload import DurationModel

__all__ = ["NL2REPO_122B", "NL2REPO_122B_RUN", "QWEN36_122B", "nl2repo_122b_knobs"]

_NL2REPO = shipped_workload("nl2repo-122b")
assert isinstance(_NL2REPO.durations, DurationModel) and _NL2REPO.model and _NL2REPO.run

# Mean rollout 1.93 h, mean query 2.96 h, 9.51% of queries over 4 h; the timeout (6 h) is assumed.
NL2REPO_122B: DurationModel = _NL2REPO.durations
QWEN36_122B: ModelFacts = _NL2REPO.model
NL2REPO_122B_RUN: PublishedRun = _NL2REPO.run


@functools.cache
def nl2repo_122b_knobs() -> DerivedKnobs:
    """The shipped 122B workload's unpublished knobs, derived from its published run (``SimConfig()``'s
    defaults)."""
    return derive_knobs(NL2REPO_122B_RUN, QWEN36_122B, _NL2REPO.gpu, NL2REPO_122B)
