"""From ready groups to one step's samples: checks, admission, bounded sampling, weights.

Everything a step consumes is accounted for: trained executions, and dropped ones with the reason
(``masked:...``, ``excluded:...``, ``filtered:...``, ``no-signal:...``), so nothing is silently lost or
trained twice. The order matters: every execution that could train is first checked (its trajectory, its
tokens, its temperature, its staleness) and sampled; then admission decides over the whole step (the breaker
counts every drop) and computes each group's baseline over the members that are actually trained.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opengyre.trajectory import PayloadUnavailable, TrajectoryError, TrajectoryTree

from ._admission import AdmissionPolicy, Decision, GroupAdmission, GroupInput, classify_outcome
from ._cost import SampleCost, sample_cost
from ._samples import LossAggregation, SampleError, TrainingSample, execution_samples, execution_weight
from ._sampling import PathSampler
from ._staleness import staleness
from ._store import ReadyGroup

__all__ = ["PreparedStep", "prepare_step"]


@dataclass
class PreparedStep:
    step: int
    samples: list[TrainingSample] = field(default_factory=list)
    trained: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    groups: list[GroupAdmission] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # trained execution -> its score
    staleness_mean: float = 0.0
    staleness_max: int = 0
    # What bounded sampling cost against every path (the live version of the 25.2% figure).
    paths: int = 0
    leaves: int = 0
    forward_tokens: int = 0
    all_paths_forward_tokens: int = 0
    generated_tokens: int = 0  # tokens the trained executions generated (``targets`` of them were trained)
    # The step's circuit breaker: its samples, how many were dropped, and the transient ones it kept.
    step_samples: int = 0
    step_dropped: int = 0
    breaker_tripped: bool = False
    breaker_kept: int = 0

    def merge(self, other: PreparedStep) -> None:
        """Fold another part of the same step in (streaming prepares one group at a time)."""
        # Staleness is a mean over the stamped target tokens: weigh each part's mean by its count of them.
        n, m = _stamped_targets(self.samples), _stamped_targets(other.samples)
        self.samples += other.samples
        self.trained += other.trained
        self.dropped.update(other.dropped)
        self.groups += other.groups
        self.rewards.update(other.rewards)
        if n + m:
            self.staleness_mean = (self.staleness_mean * n + other.staleness_mean * m) / (n + m)
        self.staleness_max = max(self.staleness_max, other.staleness_max)
        self.paths += other.paths
        self.leaves += other.leaves
        self.forward_tokens += other.forward_tokens
        self.all_paths_forward_tokens += other.all_paths_forward_tokens
        self.generated_tokens += other.generated_tokens
        self.step_samples += other.step_samples
        self.step_dropped += other.step_dropped
        self.breaker_tripped = self.breaker_tripped or other.breaker_tripped
        self.breaker_kept += other.breaker_kept

    @property
    def reward_mean(self) -> float | None:
        return sum(self.rewards.values()) / len(self.rewards) if self.rewards else None


@dataclass
class _Checked:
    samples: list[TrainingSample]
    cost: SampleCost
    generated: int
    truncated: bool  # a call was cut at the engine's length limit


def prepare_step(
    step: int,
    groups: Sequence[ReadyGroup],
    *,
    policy: AdmissionPolicy,
    sampler: PathSampler,
    load_tree: Callable[[str], TrajectoryTree],
    corrupt: Mapping[str, str],
    version_steps: Mapping[str, int],
    untrusted: Mapping[str, str] | None = None,
    seed: int = 0,
    max_staleness: int | None = None,
    vocab_size: int | None = None,
    aggregation: LossAggregation = "execution-mean",
    overlong_filter: bool = False,
    prior: tuple[int, int] = (0, 0),
) -> PreparedStep:
    """``vocab_size``: the model's; a trajectory holding a token id past it is corrupt (the projection cannot
    know the model, and the embedding would fail the whole step). ``overlong_filter``: mask executions with a
    call the engine cut at its length limit (DAPO's overlong filtering). ``prior``: (samples, dropped) of the
    step's groups prepared before these (a streaming step prepares group by group). Token weights follow
    ``aggregation`` unnormalised; ``loss_normaliser`` divides each update (see ``_samples``). ``untrusted``:
    executions the trainer cannot vouch for (a call from an engine after it failed to load), with why."""
    untrusted = untrusted or {}
    out = PreparedStep(step=step)
    dropped: dict[str, tuple[Decision, str]] = {}
    checked: dict[str, _Checked] = {}
    for g in groups:
        for o in g.outcomes:
            if classify_outcome(o)[0] in ("ok", "transient"):
                if o.execution_id in untrusted:
                    dropped[o.execution_id] = ("excluded", untrusted[o.execution_id])
                    continue
                verdict = _check(
                    o.execution_id, step, sampler, load_tree, corrupt, seed, vocab_size, overlong_filter, aggregation
                )
                if isinstance(verdict, tuple):
                    dropped[o.execution_id] = verdict
                else:
                    checked[o.execution_id] = verdict
    if max_staleness is not None:
        lags = staleness([s for c in checked.values() for s in c.samples], version_steps, step).per_execution
        for eid, lag in lags.items():
            if lag > max_staleness:
                dropped[eid] = ("filtered", f"stale:{lag}")
                del checked[eid]
    admitted = policy.admit_step(
        [GroupInput(g.group_id, g.outcomes, g.size or None) for g in groups],
        dropped,
        {e: c.generated for e, c in checked.items()},
        prior=prior,
        truncated=[e for e, c in checked.items() if c.truncated],
    )
    out.groups = list(admitted.groups)
    out.step_samples, out.step_dropped = admitted.samples, admitted.dropped
    out.breaker_tripped, out.breaker_kept = admitted.breaker_tripped, admitted.breaker_kept
    for adm in admitted.groups:
        for a in adm.admissions:
            if a.decision != "train":
                out.dropped[a.execution_id] = f"{a.decision}:{a.reason}"
                continue
            c = checked[a.execution_id]
            out.samples += [dataclasses.replace(s, advantage=a.advantage) for s in c.samples]
            out.trained.append(a.execution_id)
            if a.score is not None:
                out.rewards[a.execution_id] = a.score
            out.paths += c.cost.paths
            out.leaves += c.cost.leaves
            out.forward_tokens += c.cost.forward_tokens
            out.all_paths_forward_tokens += c.cost.all_paths_forward_tokens
            out.generated_tokens += c.generated
    st = staleness(out.samples, version_steps, step)
    out.staleness_mean, out.staleness_max = st.mean, st.max
    return out


def _check(
    eid: str,
    step: int,
    sampler: PathSampler,
    load_tree: Callable[[str], TrajectoryTree],
    corrupt: Mapping[str, str],
    seed: int,
    vocab_size: int | None,
    overlong_filter: bool,
    aggregation: LossAggregation,
) -> _Checked | tuple[Decision, str]:
    """An execution's samples (advantage still 0), or why it cannot train."""
    if eid in corrupt:
        return "excluded", f"rejected:{corrupt[eid]}"
    try:
        tree = load_tree(eid)
    except PayloadUnavailable as exc:  # its recorded tokens are gone or damaged: never trained on a guess
        return "excluded", exc.reason
    except TrajectoryError as exc:
        return "excluded", f"corrupt-trajectory:{str(exc)[:40]}"
    if vocab_size is not None and (top := _largest_token(tree)) >= vocab_size:
        return "excluded", f"corrupt-trajectory:token {top} past the vocabulary"
    nodes = tree.nodes.values()
    if any(n.output_ids and n.temperature is None for n in nodes):
        # The logprobs the engine recorded are at the sampling temperature; without it the trainer's cannot
        # be made comparable, and assuming 1 would bias both the importance ratio and the gradient.
        return "excluded", "unknown-temperature"
    if overlong_filter and any(n.finish_reason == "length" for n in nodes):
        return "masked", "overlong"
    # A per-execution stream: the draw does not depend on which other executions share the step.
    paths = sampler.sample(tree, random.Random(f"{seed}:{step}:{eid}"))
    n_targets = sum(p.n_targets for p in paths)
    if not n_targets:
        return "excluded", "no-generated-tokens"
    try:
        samples = execution_samples(eid, paths, 0.0, execution_weight(aggregation, n_targets))
    except SampleError as exc:
        return "excluded", f"corrupt-sample:{str(exc)[:40]}"
    generated = sum(len(n.output_ids) for n in nodes)
    truncated = any(n.finish_reason == "length" for n in nodes)
    return _Checked(samples, sample_cost(tree, paths), generated, truncated)


def _stamped_targets(samples: Sequence[TrainingSample]) -> int:
    """The target tokens ``staleness`` averages over (those of samples with version stamps)."""
    return sum(s.n_targets for s in samples if s.weight_versions)


def _largest_token(tree: TrajectoryTree) -> int:
    return max((max((*n.prompt_delta_ids, *n.output_ids), default=0) for n in tree.nodes.values()), default=0)
