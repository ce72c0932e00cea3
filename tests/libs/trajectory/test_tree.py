"""The trajectory tree: sequences rebuilt from deltas equal a naive full-prefix reference; bad nodes refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opengyre.events import ModelCallRecorded
from opengyre.trajectory import Node, TrajectoryError, TrajectoryTree

Owner = tuple[str, int] | None


def _naive(nodes: list[Node]) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[Owner, ...]]]:
    """The obvious construction: every node's whole token sequence and provenance, copied from its parent."""
    toks: dict[str, tuple[int, ...]] = {}
    owners: dict[str, tuple[Owner, ...]] = {}
    for n in nodes:
        base_t = toks[n.parent_call_id][: n.prefix_len] if n.parent_call_id else ()
        base_o = owners[n.parent_call_id][: n.prefix_len] if n.parent_call_id else ()
        toks[n.call_id] = base_t + tuple(n.prompt_delta_ids) + tuple(n.output_ids)
        owners[n.call_id] = (
            base_o + (None,) * len(n.prompt_delta_ids) + tuple((n.call_id, i) for i in range(len(n.output_ids)))
        )
    return toks, owners


@st.composite
def trees(draw: st.DrawFn) -> list[Node]:
    nodes: list[Node] = []
    lengths: dict[str, int] = {}
    for i in range(draw(st.integers(1, 10))):
        parent = draw(st.sampled_from(nodes)) if nodes and draw(st.booleans()) else None
        prefix = draw(st.integers(0, lengths[parent.call_id])) if parent else 0
        delta = draw(st.lists(st.integers(0, 287), max_size=6))
        out = draw(st.lists(st.integers(0, 287), max_size=6))
        n = Node(f"c{i}", parent.call_id if parent else None, prefix, delta, out, [-0.5] * len(out))
        nodes.append(n)
        lengths[n.call_id] = prefix + len(delta) + len(out)
    return nodes


@settings(max_examples=150, deadline=None)
@given(trees())
def test_sequences_built_from_deltas_equal_the_full_prefix_construction(nodes: list[Node]) -> None:
    tree = TrajectoryTree("ex", nodes)
    toks, owners = _naive(nodes)
    for n in nodes:
        assert tree.tokens(n.call_id) == toks[n.call_id]
        assert tree.length(n.call_id) == len(toks[n.call_id])
        assert tree.prompt(n.call_id) == toks[n.call_id][: len(toks[n.call_id]) - len(n.output_ids)]
        path = tree.path_sequence(n.call_id)
        assert path.tokens == toks[n.call_id] and path.owners == owners[n.call_id]
        assert path.generated == tuple(o is not None for o in owners[n.call_id])
    assert tree.stored_token_count() == sum(len(n.prompt_delta_ids) + len(n.output_ids) for n in nodes)
    assert set(tree.leaves()) == {n.call_id for n in nodes} - {n.parent_call_id for n in nodes}


def test_a_hand_built_tree_gives_exact_paths_and_provenance() -> None:
    tree = TrajectoryTree(
        "ex",
        [
            Node("a", None, 0, [1, 2, 3], [4, 5], [-0.1, -0.2], weight_version="v1"),
            Node("b", "a", 5, [6], [7], [-0.3], weight_version="v2"),
            Node("s", "a", 3, [9], [8], [-0.4], role="main-summary"),  # a compaction forks inside a's prompt
        ],
    )
    b = tree.path_sequence("b")
    assert b.tokens == (1, 2, 3, 4, 5, 6, 7)
    assert b.generated == (False, False, False, True, True, False, True)
    assert b.behaviour_logprobs == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3)
    assert b.weight_versions == ("", "", "", "v1", "v1", "", "v2")
    assert b.call_ids == ("a", "b") and b.role == "main"
    s = tree.path_sequence("s")
    assert s.tokens == (1, 2, 3, 9, 8) and s.generated == (False, False, False, False, True)
    assert s.role == "main-summary" and tree.leaves() == ["b", "s"]


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (Node("x", "nope", 0, [1], [], []), "unknown parent"),
        (Node("x", "a", 6, [1], [], []), "beyond parent's 5 tokens"),
        (Node("x", None, 2, [1], [], []), "root call x has prefix_len 2"),
        (Node("x", "a", -1, [1], [], []), "negative prefix_len"),
        (Node("x", "a", 1, [1], [2, 3], [-0.1]), "2 output ids but 1 logprobs"),
        (Node("a", None, 0, [1], [], []), "already in the tree"),
    ],
)
def test_nodes_that_do_not_fit_are_refused(node: Node, message: str) -> None:
    tree = TrajectoryTree("ex", [Node("a", None, 0, [1, 2, 3], [4, 5], [-0.1, -0.2])])
    with pytest.raises(TrajectoryError, match=message):
        tree.add(node)
    assert len(tree) == 1


def test_nodes_come_from_recorded_events() -> None:
    e = ModelCallRecorded(
        execution_id="ex", call_id="a", prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-1.0]
    )
    tree = TrajectoryTree("ex", [e])
    assert tree.tokens("a") == (1, 2, 3) and "a" in tree
    with pytest.raises(TrajectoryError, match="no call zz"):
        tree.tokens("zz")
