"""Bounded sampling on a hand-built tree: exact draw weights, target masks, role order and loss weights."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from opengyre.trainer import PathSampler, execution_samples, sample_cost
from opengyre.trainer._sampling import path_ends
from opengyre.trajectory import TrajectoryTree

from ._trees import branching_tree, node, positions

# random.Random(0).random() * 10 = 8.44 (picks m3 among main weights {m2: 3, m3: 7}); seed 1 gives 1.34 (m2).
SEED_M3_FIRST, SEED_M2_FIRST = 0, 1


def test_initial_draw_weights_are_unmasked_trainable_tokens() -> None:
    t = branching_tree()
    s = PathSampler(5)
    assert s.draw_weights(t, set(), "main") == {"m2": 3, "m3": 7}
    assert s.draw_weights(t, set(), "main-summary") == {"s": 3}
    assert s.draw_weights(t, set(), "sub-agent-summary") == {"a2": 5}
    assert s.draw_weights(t, set(), "sub-agent") == {}


def test_unbounded_draw_gives_exact_masks_and_every_token_once() -> None:
    t = branching_tree()
    drawn = PathSampler(None).sample(t, random.Random(SEED_M3_FIRST))
    assert [d.path.leaf for d in drawn] == ["m3", "m2", "s", "a2"]  # main, main, main-summary, sub-agent-summary
    assert [d.draw_weight for d in drawn] == [7, 1, 2, 5]
    assert positions(drawn[0].targets) == [3, 4, 6, 7, 8, 10, 11]
    assert positions(drawn[1].targets) == [7]  # r's output was trained through m3
    assert positions(drawn[2].targets) == [5, 6]  # s shares r's first output token with m3
    assert positions(drawn[3].targets) == [2, 3, 4, 5, 7]
    # Every generated token of the tree is a target exactly once.
    owners = Counter(d.path.owners[i] for d in drawn for i in positions(d.targets))
    generated = {(c, i) for c, n in t.nodes.items() for i in range(len(n.output_ids))}
    assert set(owners) == generated and set(owners.values()) == {1}


def test_draw_weights_follow_masking_after_the_first_draw() -> None:
    t = branching_tree()
    drawn = PathSampler(2).sample(t, random.Random(SEED_M2_FIRST))
    assert [(d.path.leaf, d.draw_weight) for d in drawn] == [("m2", 3), ("m3", 5)]
    assert positions(drawn[0].targets) == [3, 4, 7]
    assert positions(drawn[1].targets) == [6, 7, 8, 10, 11]


@pytest.mark.parametrize("j", [1, 2, 3, 5])
def test_never_more_than_j_paths_and_role_priority(j: int) -> None:
    t = branching_tree()
    rank = {"main": 0, "main-summary": 1, "sub-agent": 2, "sub-agent-summary": 3}
    for seed in range(20):
        drawn = PathSampler(j).sample(t, random.Random(seed))
        assert len(drawn) == min(j, 4)
        roles = [rank[d.path.role] for d in drawn]
        assert roles == sorted(roles)
        if j == 1:
            assert drawn[0].path.role == "main"


def test_leaf_frequencies_follow_weights() -> None:
    t = branching_tree()
    firsts = Counter(PathSampler(1).sample(t, random.Random(seed))[0].path.leaf for seed in range(2000))
    assert abs(firsts["m3"] / 2000 - 0.7) < 0.04


def test_leaf_with_nothing_left_to_train_is_never_drawn() -> None:
    t = branching_tree()
    # m1b re-reads m1 without generating anything new: once main's m3 is drawn, m1b has weight 0.
    t.add(node("m1b", "m1", 9, [], [], role="main-summary"))
    drawn = PathSampler(None).sample(t, random.Random(SEED_M3_FIRST))
    assert "m1b" not in [d.path.leaf for d in drawn]


def test_execution_weights_average_within_the_execution() -> None:
    t = branching_tree()
    drawn = PathSampler(None).sample(t, random.Random(SEED_M3_FIRST))
    samples = execution_samples("x", drawn, advantage=0.5, execution_share=0.25)
    assert [s.token_weight for s in samples] == [pytest.approx(0.25 / 15)] * 4
    assert sum(s.token_weight * s.n_targets for s in samples) == pytest.approx(0.25)
    one = execution_samples("y", PathSampler(1).sample(t, random.Random(SEED_M3_FIRST)), 0.5, 0.25)
    assert sum(s.token_weight * s.n_targets for s in one) == pytest.approx(0.25)  # same total weight


def test_rejects_bad_j() -> None:
    with pytest.raises(ValueError):
        PathSampler(0)


@pytest.mark.parametrize("seed", range(6))
def test_bounds_and_once_only_on_synthetic_agentic_trees(seed: int) -> None:
    from opengyre.trainer import TreeShape, agentic_tree

    t = agentic_tree(f"s{seed}", random.Random(seed), TreeShape(retry_p=0.5, sub_retry_p=0.5))
    roles = {t.node(leaf).role for leaf in t.leaves()}
    assert {"main", "main-summary", "sub-agent-summary"} <= roles  # sub-agent leaves exist only via retries
    rank = {"main": 0, "main-summary": 1, "sub-agent": 2, "sub-agent-summary": 3}
    for j in (1, 5, None):
        drawn = PathSampler(j).sample(t, random.Random(seed))
        assert len(drawn) <= (j or len(t.leaves()))
        assert [rank[d.path.role] for d in drawn] == sorted(rank[d.path.role] for d in drawn)
        owners = [d.path.owners[i] for d in drawn for i in positions(d.targets)]
        assert len(owners) == len(set(owners))  # a shared token is a target at most once
        if j is None:
            generated = {(c, i) for c, n in t.nodes.items() for i in range(len(n.output_ids))}
            assert set(owners) == generated


def test_a_child_forked_inside_its_parents_output_leaves_no_token_untrainable() -> None:
    # r generated 10 11 12 13; c was prompted with r's prompt and only 10 11 of that output (a rewrite that cut
    # it), then generated 20 21. No leaf's path holds 12 13: r's own path must be a candidate.
    t = TrajectoryTree("ex")
    t.add(node("r", None, 0, [1, 2, 3], [10, 11, 12, 13]))
    t.add(node("c", "r", 5, [4], [20, 21]))
    assert t.leaves() == ["c"] and path_ends(t) == ["r", "c"]
    for seed in range(5):
        drawn = PathSampler(None).sample(t, random.Random(seed))
        owners = Counter(d.path.owners[i] for d in drawn for i in positions(d.targets))
        generated = {(c, i) for c, n in t.nodes.items() for i in range(len(n.output_ids))}
        assert set(owners) == generated and set(owners.values()) == {1}
    cost = sample_cost(t, PathSampler(1).sample(t, random.Random(0)))
    assert cost.generated_tokens == 6 and cost.target_tokens < 6  # a bounded draw says what it left out
