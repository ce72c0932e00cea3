"""What a bounded sample costs against training every root-to-leaf path (the 25.2% figure's quantities)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opengyre.trajectory import TrajectoryTree

from ._sampling import SampledPath, path_ends, trainable_owners

__all__ = ["SampleCost", "sample_cost"]


@dataclass(frozen=True)
class SampleCost:
    leaves: int  # path ends: leaves, and nodes a child forked inside
    paths: int  # drawn
    generated_tokens: int  # distinct trainable policy tokens in the tree
    target_tokens: int  # targets in the drawn paths (each shared token once)
    forward_tokens: int  # tokens the drawn paths run through forward/backward
    all_paths_forward_tokens: int  # the same with every path


def sample_cost(tree: TrajectoryTree, drawn: Sequence[SampledPath]) -> SampleCost:
    all_paths = [tree.path_sequence(end) for end in path_ends(tree)]
    generated = {o for p in all_paths for _, o in trainable_owners(p)}
    return SampleCost(
        leaves=len(all_paths),
        paths=len(drawn),
        generated_tokens=len(generated),
        target_tokens=sum(d.n_targets for d in drawn),
        forward_tokens=sum(len(d.path.tokens) for d in drawn),
        all_paths_forward_tokens=sum(len(p.tokens) for p in all_paths),
    )
