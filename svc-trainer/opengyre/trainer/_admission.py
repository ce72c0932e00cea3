"""Admission: which finished executions reach the loss, and with what advantage.

- Evaluator failure (no valid score) is excluded: it is not a zero.
- Infrastructure failures (OOM, sandbox, engine) are masked: never trained as negatives.
- Transient failures (timeouts of a tool call, network stalls) with a valid score are filtered, but a circuit
  breaker stops filtering once half of a group would be dropped, so a flaky stretch cannot starve training.
- Group statistics use the surviving members only; a group with fewer than two survivors (a lone survivor)
  or with no spread in reward gives no advantage.
Timed-out executions are ordinary members: they carry their evaluator's score on the preserved workspace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from opengyre.events import ExecutionStatus, FailureClass

from ._advantages import group_advantages
from ._failures import INFRA_CLASSES, TRANSIENT_CLASSES

__all__ = ["Admission", "AdmissionPolicy", "Decision", "ExecutionOutcome", "GroupAdmission", "classify_outcome"]

Decision = Literal["train", "masked", "excluded", "filtered", "no-signal"]


@dataclass(frozen=True, slots=True)
class ExecutionOutcome:
    execution_id: str
    group_id: str
    status: ExecutionStatus
    score: float | None
    failure_class: FailureClass | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    execution_id: str
    decision: Decision
    reason: str
    advantage: float = 0.0
    score: float | None = None


@dataclass(frozen=True, slots=True)
class GroupAdmission:
    group_id: str
    admissions: tuple[Admission, ...]
    breaker_tripped: bool = False
    mean: float = 0.0
    std: float = 0.0
    survivors: int = 0

    def trained(self) -> list[Admission]:
        return [a for a in self.admissions if a.decision == "train"]

    def by_id(self) -> dict[str, Admission]:
        return {a.execution_id: a for a in self.admissions}


def classify_outcome(o: ExecutionOutcome) -> tuple[Literal["ok", "transient", "masked", "excluded"], str]:
    """The per-execution verdict, before any group is looked at."""
    if o.status == "infra-failed" or (o.failure_class in INFRA_CLASSES):
        return "masked", f"infra:{o.failure_class or 'unknown'}"
    if o.status == "evaluator-failed" or o.failure_class == "evaluator":
        return "excluded", "evaluator-failure"
    if o.score is None:
        return "excluded", "no-valid-score"
    if not math.isfinite(o.score):
        return "excluded", "invalid-score"
    if o.failure_class in TRANSIENT_CLASSES:
        return "transient", f"transient:{o.failure_class}"
    return "ok", o.status


@dataclass(frozen=True)
class AdmissionPolicy:
    group_size: int = 16
    breaker_ratio: float = 0.5  # stop filtering once this share of the group would be dropped
    normalize_std: bool = True  # GRPO divides by the group's std; Dr. GRPO does not
    eps: float = 1e-6
    # Early-stage curriculum (ROLL): update on positive-advantage executions only; still the RL objective.
    positive_only: bool = False

    def validate(self) -> None:
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")
        if not 0.0 < self.breaker_ratio <= 1.0:
            raise ValueError("breaker_ratio must be in (0, 1]")

    def admit(self, group_id: str, outcomes: Sequence[ExecutionOutcome], size: int | None = None) -> GroupAdmission:
        """Decide every member of one group (outcomes in any order; decisions come back sorted by id).

        ``size`` is the group's real size (what was dispatched); by default its member count. The breaker's
        "half of the group" is of that size, not of the policy's default ``group_size``."""
        members = sorted(outcomes, key=lambda o: o.execution_id)
        size = max(size or len(members), len(members))
        verdicts = {o.execution_id: classify_outcome(o) for o in members}
        dropped = sum(1 for v, _ in verdicts.values() if v in ("masked", "excluded"))
        decisions: dict[str, tuple[Decision, str]] = {}
        tripped = False
        for o in members:
            verdict, reason = verdicts[o.execution_id]
            if verdict == "masked":
                decisions[o.execution_id] = ("masked", reason)
            elif verdict == "excluded":
                decisions[o.execution_id] = ("excluded", reason)
            elif verdict == "transient":
                if (dropped + 1) < self.breaker_ratio * size:
                    dropped += 1
                    decisions[o.execution_id] = ("filtered", reason)
                else:
                    tripped = True  # keep it, with its real score: filtering would empty the group
                    decisions[o.execution_id] = ("train", reason + ",breaker-kept")
            else:
                decisions[o.execution_id] = ("train", reason)
        survivors = [o for o in members if decisions[o.execution_id][0] == "train"]
        scores = [float(o.score) for o in survivors if o.score is not None]
        adv, mean, std = group_advantages(scores, normalize_std=self.normalize_std, eps=self.eps)
        advantages = dict(zip([o.execution_id for o in survivors], adv, strict=True))
        out: list[Admission] = []
        for o in members:
            decision, reason = decisions[o.execution_id]
            a = advantages.get(o.execution_id, 0.0)
            if decision == "train" and len(survivors) < 2:
                decision, reason = "no-signal", "lone-survivor"
            elif decision == "train" and all(x == 0.0 for x in adv):
                decision, reason = "no-signal", "no-reward-spread"
            elif decision == "train" and self.positive_only and a <= 0.0:
                decision, reason = "filtered", "positive-only"
            out.append(Admission(o.execution_id, decision, reason, a if decision == "train" else 0.0, o.score))
        return GroupAdmission(group_id, tuple(out), tripped, mean, std, len(survivors))
