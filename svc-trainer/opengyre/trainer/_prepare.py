"""From ready groups to one step's samples: admission, corruption checks, bounded sampling, weights.

Everything a step consumes is accounted for: trained executions, and dropped ones with the reason
(``masked:...``, ``excluded:...``, ``filtered:...``, ``no-signal:...``), so nothing is silently lost or
trained twice.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opengyre.trajectory import PayloadUnavailable, TrajectoryError, TrajectoryTree

from ._admission import AdmissionPolicy, GroupAdmission
from ._cost import SampleCost, sample_cost
from ._samples import SampleError, TrainingSample, execution_samples
from ._sampling import PathSampler, SampledPath
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

    @property
    def reward_mean(self) -> float | None:
        return sum(self.rewards.values()) / len(self.rewards) if self.rewards else None


def prepare_step(
    step: int,
    groups: Sequence[ReadyGroup],
    *,
    policy: AdmissionPolicy,
    sampler: PathSampler,
    load_tree: Callable[[str], TrajectoryTree],
    corrupt: Mapping[str, str],
    version_steps: Mapping[str, int],
    seed: int = 0,
    max_staleness: int | None = None,
    step_share: float = 1.0,
    max_negative_tokens: int | None = None,
    vocab_size: int | None = None,
) -> PreparedStep:
    """``step_share``: the part of the step's loss these groups carry (1 when they are the whole step; a
    streaming step prepares group by group, each with ``1 / groups_per_step``). ``max_negative_tokens``: mask
    negative-advantage executions that generated more tokens than this (a few extremely long failures would
    otherwise dominate the update). ``vocab_size``: the model's; a trajectory holding a token id past it is
    corrupt (the projection cannot know the model, and the embedding would fail the whole step)."""
    out = PreparedStep(step=step)
    drawn: dict[str, tuple[list[SampledPath], float]] = {}
    costs: dict[str, SampleCost] = {}
    for g in groups:
        adm = policy.admit(g.group_id, g.outcomes, g.size or None)
        out.groups.append(adm)
        for a in adm.admissions:
            if a.decision != "train":
                out.dropped[a.execution_id] = f"{a.decision}:{a.reason}"
                continue
            if a.execution_id in corrupt:
                out.dropped[a.execution_id] = f"excluded:rejected:{corrupt[a.execution_id]}"
                continue
            try:
                tree = load_tree(a.execution_id)
            except PayloadUnavailable as exc:  # its recorded tokens are gone or damaged: never trained on a guess
                out.dropped[a.execution_id] = f"excluded:{exc.reason}"
                continue
            except TrajectoryError as exc:
                out.dropped[a.execution_id] = f"excluded:corrupt-trajectory:{str(exc)[:40]}"
                continue
            if vocab_size is not None and (top := _largest_token(tree)) >= vocab_size:
                out.dropped[a.execution_id] = f"excluded:corrupt-trajectory:token {top} past the vocabulary"
                continue
            if max_negative_tokens is not None and a.advantage < 0:
                generated = sum(len(n.output_ids) for n in tree.nodes.values())
                if generated > max_negative_tokens:
                    out.dropped[a.execution_id] = f"masked:long-negative:{generated}"
                    continue
            # A per-execution stream: the draw does not depend on which other executions share the step.
            rng = random.Random(f"{seed}:{step}:{a.execution_id}")
            paths = sampler.sample(tree, rng)
            if not any(p.n_targets for p in paths):
                out.dropped[a.execution_id] = "excluded:no-generated-tokens"
                continue
            drawn[a.execution_id] = (paths, a.advantage)
            costs[a.execution_id] = sample_cost(tree, paths)
            if a.score is not None:
                out.rewards[a.execution_id] = a.score
    built: dict[str, list[TrainingSample]] = {}
    for eid, (paths, adv) in drawn.items():
        try:
            built[eid] = execution_samples(eid, paths, adv, 1.0)
        except SampleError as exc:
            out.dropped[eid] = f"excluded:corrupt-sample:{str(exc)[:40]}"
            out.rewards.pop(eid, None)
    # Each execution that made it carries the same share: the step's token weights sum to ``step_share``.
    share = step_share / len(built) if built else 0.0
    for eid, samples in built.items():
        out.samples += [_rescale(x, share) for x in samples]
        out.trained.append(eid)
    st = staleness(out.samples, version_steps, step)
    if max_staleness is not None:
        stale = {e for e, lag in st.per_execution.items() if lag > max_staleness}
        if stale:
            for e in stale:
                out.dropped[e] = f"filtered:stale:{st.per_execution[e]}"
                out.rewards.pop(e, None)
            out.trained = [e for e in out.trained if e not in stale]
            kept = [s for s in out.samples if s.execution_id not in stale]
            # Re-share the loss among the executions left, so the step's weights still sum to 1.
            scale = (len(out.trained) + len(stale)) / len(out.trained) if out.trained else 0.0
            out.samples = [_rescale(s, scale) for s in kept]
            st = staleness(out.samples, version_steps, step)
    out.staleness_mean, out.staleness_max = st.mean, st.max
    for eid in out.trained:
        c = costs[eid]
        out.paths += c.paths
        out.leaves += c.leaves
        out.forward_tokens += c.forward_tokens
        out.all_paths_forward_tokens += c.all_paths_forward_tokens
    return out


def _stamped_targets(samples: Sequence[TrainingSample]) -> int:
    """The target tokens ``staleness`` averages over (those of samples with version stamps)."""
    return sum(s.n_targets for s in samples if s.weight_versions)


def _largest_token(tree: TrajectoryTree) -> int:
    return max((max((*n.prompt_delta_ids, *n.output_ids), default=0) for n in tree.nodes.values()), default=0)


def _rescale(s: TrainingSample, scale: float) -> TrainingSample:
    return dataclasses.replace(s, token_weight=s.token_weight * scale)
