"""Admission: which finished executions reach the loss, and with what advantage.

- Evaluator failure (no valid score) is excluded: it is not a zero.
- Infrastructure failures (OOM, sandbox, engine) are masked: never trained as negatives.
- Transient failures (a tool call's infrastructure timing out, network stalls) with a valid score are filtered,
  but a circuit breaker over the whole step stops filtering once ``breaker_ratio`` of the step's samples would
  be dropped (the practice chapter's global 50 %), so a flaky stretch cannot starve training.
- The agent's own code hanging or exhausting memory while graded is the agent's failure: graded 0, trained.
- Group statistics use the members actually trained, after every later drop (a corrupt trajectory, a stale or
  overlong execution, a long or truncated negative), so the trained advantages are zero-mean (unless
  ``negative_weight`` re-weights the negatives afterwards); a group with fewer than two
  (a lone survivor) or with no spread in reward gives no advantage.
Timed-out executions are ordinary members: they carry their evaluator's score on the preserved workspace.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from opengyre.events import ExecutionStatus, FailureClass

from ._advantages import group_advantages
from ._failures import INFRA_CLASSES, TRANSIENT_CLASSES

__all__ = [
    "Admission",
    "AdmissionPolicy",
    "Decision",
    "ExecutionOutcome",
    "GroupAdmission",
    "GroupInput",
    "StepAdmission",
    "classify_outcome",
]

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
    score: float | None = None  # the evaluator's score
    reward: float | None = None  # what the baseline used: the score, shaped for overlong executions


@dataclass(frozen=True, slots=True)
class GroupAdmission:
    group_id: str
    admissions: tuple[Admission, ...]
    breaker_tripped: bool = False  # the step's breaker kept a transient member of this group
    mean: float = 0.0
    std: float = 0.0
    survivors: int = 0  # the members trained (what the statistics are over)

    def trained(self) -> list[Admission]:
        return [a for a in self.admissions if a.decision == "train"]

    def by_id(self) -> dict[str, Admission]:
        return {a.execution_id: a for a in self.admissions}


@dataclass(frozen=True, slots=True)
class GroupInput:
    group_id: str
    outcomes: Sequence[ExecutionOutcome]
    size: int | None = None  # the dispatched size (None: the member count)


@dataclass(frozen=True)
class StepAdmission:
    groups: tuple[GroupAdmission, ...]
    breaker_tripped: bool = False  # filtering stopped: the step had dropped as much as the breaker allows
    breaker_kept: int = 0  # transient members trained because the breaker tripped
    samples: int = 0  # the step's samples: the sum of its groups' sizes (what the breaker's ratio is of)
    dropped: int = 0  # of them, dropped for any reason but "no signal"


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
    if o.failure_class is not None:  # the agent's own code hung or ran out of memory: graded, trained
        return "ok", f"{o.status}:{o.failure_class}"
    return "ok", o.status


@dataclass(frozen=True)
class AdmissionPolicy:
    group_size: int = 16
    breaker_ratio: float = 0.5  # stop filtering once this share of the step's samples would be dropped
    normalize_std: bool = True  # GRPO divides by the group's std; Dr. GRPO does not
    eps: float = 1e-6
    # Early-stage curriculum (ROLL): update on positive-advantage executions only; still the RL objective.
    positive_only: bool = False
    # Mask negative-advantage executions that generated more tokens than this (ROLL's long-failure masking).
    max_negative_tokens: int | None = None
    # Mask negative-advantage executions with a call cut at the length limit (ROLL's max_len_mask, for failures).
    mask_truncated_negatives: bool = False
    # Multiply every trained negative advantage by this (ROLL's global re-weighting of negatives, TOPR's weight).
    negative_weight: float = 1.0
    # DAPO's soft overlong punishment: past ``overlong_max_tokens - overlong_buffer_tokens`` generated tokens the
    # reward falls linearly, by 1 at ``overlong_max_tokens`` (and stays there beyond).
    overlong_max_tokens: int | None = None
    overlong_buffer_tokens: int = 0

    def validate(self) -> None:
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")
        if not 0.0 < self.breaker_ratio <= 1.0:
            raise ValueError("breaker_ratio must be in (0, 1]")
        if self.overlong_max_tokens is not None and not 0 <= self.overlong_buffer_tokens <= self.overlong_max_tokens:
            raise ValueError("overlong_buffer_tokens must be in [0, overlong_max_tokens]")
        if not self.negative_weight > 0:
            raise ValueError(f"negative_weight must be > 0, got {self.negative_weight}")

    def shaped(self, score: float, generated: int | None) -> float:
        """The reward the baseline uses: the score, minus DAPO's overlong penalty where it applies."""
        if self.overlong_max_tokens is None or not self.overlong_buffer_tokens or generated is None:
            return score
        start = self.overlong_max_tokens - self.overlong_buffer_tokens
        if generated <= start:
            return score
        return score - min((generated - start) / self.overlong_buffer_tokens, 1.0)

    def admit(self, group_id: str, outcomes: Sequence[ExecutionOutcome], size: int | None = None) -> GroupAdmission:
        """One group on its own (its breaker is then the group's; a step's is over all its groups)."""
        return self.admit_step([GroupInput(group_id, outcomes, size)]).groups[0]

    def admit_step(
        self,
        groups: Sequence[GroupInput],
        dropped: Mapping[str, tuple[Decision, str]] | None = None,
        generated: Mapping[str, int] | None = None,
        *,
        prior: tuple[int, int] = (0, 0),
        truncated: Collection[str] = (),
    ) -> StepAdmission:
        """Decide every member of a step's groups (decisions come back sorted by id within each group).

        ``dropped``: members the caller found untrainable after the verdicts (a corrupt or stale trajectory), with
        their decision and reason; they count against the breaker and stay out of the statistics.
        ``generated``: tokens each member generated (overlong shaping, long-negative masking).
        ``truncated``: members with a call the engine cut at its length limit (truncated-negative masking).
        ``prior``: (samples, dropped) of the step's groups already admitted (a streaming step admits its groups
        as they arrive: the breaker then counts what the step has dropped so far).

        The breaker is global: transient members are filtered in order (group, then id) while one more drop
        stays under ``breaker_ratio`` of the step's samples (the sum of the groups' dispatched sizes); after
        that they train with their real score."""
        dropped = dict(dropped or {})
        generated = dict(generated or {})
        members = [(g, sorted(g.outcomes, key=lambda o: o.execution_id)) for g in groups]
        total = prior[0] + sum(max(g.size or len(ms), len(ms)) for g, ms in members)
        decisions: dict[str, tuple[Decision, str]] = {}
        transient: list[tuple[str, str]] = []
        for _, ms in members:
            for o in ms:
                verdict, reason = classify_outcome(o)
                if verdict in ("masked", "excluded"):
                    decisions[o.execution_id] = (verdict, reason)
                elif o.execution_id in dropped:
                    decisions[o.execution_id] = dropped[o.execution_id]
                elif verdict == "transient":
                    transient.append((o.execution_id, reason))
                else:
                    decisions[o.execution_id] = ("train", reason)
        n_dropped = prior[1] + len(decisions) - sum(1 for d, _ in decisions.values() if d == "train")
        tripped, kept = False, 0
        for eid, reason in transient:
            if (n_dropped + 1) < self.breaker_ratio * total:
                n_dropped += 1
                decisions[eid] = ("filtered", reason)
            else:
                tripped, kept = True, kept + 1  # keep it, with its real score: filtering would starve the step
                decisions[eid] = ("train", reason + ",breaker-kept")
        cut = frozenset(truncated)
        out = tuple(self._group(g.group_id, ms, decisions, generated, cut) for g, ms in members)
        return StepAdmission(out, tripped, kept, total - prior[0], n_dropped - prior[1])

    def _group(
        self,
        group_id: str,
        members: Sequence[ExecutionOutcome],
        decisions: Mapping[str, tuple[Decision, str]],
        generated: Mapping[str, int],
        truncated: frozenset[str],
    ) -> GroupAdmission:
        decided = dict(decisions)
        rewards = {
            o.execution_id: self.shaped(float(o.score), generated.get(o.execution_id))
            for o in members
            if o.score is not None
        }
        trained, advantages, adv, mean, std = self._baseline(members, decided, rewards)
        if self.max_negative_tokens is not None or self.mask_truncated_negatives:
            # Long or truncated failures are the ones below the baseline of the would-be trained members; once
            # they are masked the statistics are recomputed over what is left (once: "negative" is not
            # re-decided, or a group whose members are all long would be masked down to a lone survivor).
            masked = 0
            for e in trained:
                if advantages[e] >= 0:
                    continue
                if self.mask_truncated_negatives and e in truncated:
                    decided[e] = ("masked", "truncated-negative")
                    masked += 1
                elif self.max_negative_tokens is not None and generated.get(e, 0) > self.max_negative_tokens:
                    decided[e] = ("masked", f"long-negative:{generated[e]}")
                    masked += 1
            if masked:
                trained, advantages, adv, mean, std = self._baseline(members, decided, rewards)
        kept = any(decided[o.execution_id][1].endswith("breaker-kept") for o in members)
        out: list[Admission] = []
        for o in members:
            decision, reason = decided[o.execution_id]
            a = advantages.get(o.execution_id, 0.0)
            if decision == "train" and len(trained) < 2:
                decision, reason = "no-signal", "lone-survivor"
            elif decision == "train" and all(x == 0.0 for x in adv):
                decision, reason = "no-signal", "no-reward-spread"
            elif decision == "train" and self.positive_only and a <= 0.0:
                # Positive-only keeps the statistics of every trained member: the update uses the positive side.
                decision, reason = "filtered", "positive-only"
            if decision == "train" and a < 0.0:
                a *= self.negative_weight  # after the statistics: the baseline is the group's, the weight global
            out.append(
                Admission(
                    o.execution_id,
                    decision,
                    reason,
                    a if decision == "train" else 0.0,
                    o.score,
                    rewards.get(o.execution_id),
                )
            )
        return GroupAdmission(group_id, tuple(out), kept, mean, std, len(trained))

    def _baseline(
        self,
        members: Sequence[ExecutionOutcome],
        decided: Mapping[str, tuple[Decision, str]],
        rewards: Mapping[str, float],
    ) -> tuple[list[str], dict[str, float], list[float], float, float]:
        """The group statistics over the members decided "train": (them, advantage by id, advantages, mean, std)."""
        trained = [o.execution_id for o in members if decided[o.execution_id][0] == "train"]
        adv, mean, std = group_advantages([rewards[e] for e in trained], normalize_std=self.normalize_std, eps=self.eps)
        return trained, dict(zip(trained, adv, strict=True)), adv, mean, std
