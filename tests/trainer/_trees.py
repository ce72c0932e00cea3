"""Hand-built trajectory trees with known shapes, shared by the trainer tests."""

from __future__ import annotations

from opengyre.events import TrajectoryRole
from opengyre.trajectory import Node, TrajectoryTree


def node(
    call_id: str,
    parent: str | None,
    prefix_len: int,
    delta: list[int],
    out: list[int],
    role: TrajectoryRole = "main",
    version: str = "default",
) -> Node:
    lps = tuple(-0.1 * (i + 1) for i in range(len(out)))
    return Node(call_id, parent, prefix_len, tuple(delta), tuple(out), lps, role, version, temperature=1.0)


def branching_tree(execution_id: str = "x") -> TrajectoryTree:
    """Leaves (in order): m2 main, s main-summary, a2 sub-agent-summary, m3 main.

    r   main   ctx[1,2,3] out[10,11]                    tokens 0..4, generated at 3,4
    m1  main   r[:5] + ctx[4] + out[12,13,14]           generated at 3,4 | 6,7,8
    m2  main   r[:5] + ctx[5,6] + out[15]               generated at 3,4 | 7
    s   main-summary  m1[:4] + ctx[7] + out[16,17]      generated at 3 | 5,6
    a   sub-agent  ctx[8,9] + out[18..21]               generated at 2..5
    a2  sub-agent-summary  a[:6] + ctx[1] + out[22]     generated at 2..5 | 7
    m3  main   m1[:9] + ctx[2] + out[23,24]             generated at 3,4 | 6,7,8 | 10,11
    """
    t = TrajectoryTree(execution_id)
    t.add(node("r", None, 0, [1, 2, 3], [10, 11]))
    t.add(node("m1", "r", 5, [4], [12, 13, 14]))
    t.add(node("m2", "r", 5, [5, 6], [15]))
    t.add(node("s", "m1", 4, [7], [16, 17], role="main-summary"))
    t.add(node("a", None, 0, [8, 9], [18, 19, 20, 21], role="sub-agent"))
    t.add(node("a2", "a", 6, [1], [22], role="sub-agent-summary"))
    t.add(node("m3", "m1", 9, [2], [23, 24]))
    return t


def positions(flags: tuple[bool, ...]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]
