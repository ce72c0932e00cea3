"""Synthetic agentic trajectory trees, for benchmarks and property tests.

They have the shapes QwenGyre describes: a main chain of tool turns, retries (a re-sampled call: same prompt,
another output), context compaction (a main-summary call, then the main agent restarts from the summary as a
new root), sub-agents (their own roots and chains) and their summaries. Lengths are drawn per call; every
generated token gets a plausible behaviour logprob.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from opengyre.events import TrajectoryRole
from opengyre.trajectory import Node, TrajectoryTree

__all__ = ["TreeShape", "agentic_tree"]


@dataclass(frozen=True)
class TreeShape:
    turns: int = 10  # main-agent tool turns
    system: int = 120  # system + task prompt tokens
    tool: tuple[int, int] = (20, 70)  # tool-result tokens per turn (min, max)
    output: tuple[int, int] = (10, 40)  # generated tokens per call
    retry_p: float = 0.2  # chance a main turn was retried (an abandoned sibling)
    compact_every: int = 5  # compaction (main-summary + restart) every this many turns; 0 = never
    summary: tuple[int, int] = (20, 40)
    subagents: int = 2
    sub_turns: int = 3
    sub_retry_p: float = 0.2


def agentic_tree(execution_id: str, rng: random.Random, shape: TreeShape = TreeShape()) -> TrajectoryTree:
    t = TrajectoryTree(execution_id)
    n = 0

    def toks(lo_hi: tuple[int, int]) -> tuple[int, ...]:
        return tuple(rng.randrange(256) for _ in range(rng.randint(*lo_hi)))

    def add(
        parent: str | None, delta: tuple[int, ...], role: TrajectoryRole, out: tuple[int, ...] | None = None
    ) -> str:
        nonlocal n
        n += 1
        cid = f"c{n}"
        out = out if out is not None else toks(shape.output)
        prefix = len(t.tokens(parent)) if parent is not None else 0
        lps = tuple(-rng.expovariate(1.5) for _ in out)
        t.add(Node(cid, parent, prefix, delta, out, lps, role, temperature=1.0))
        return cid

    def chain(role: TrajectoryRole, turns: int, retry_p: float, first_prompt: tuple[int, ...]) -> str:
        cur = add(None, first_prompt, role)
        for _ in range(turns - 1):
            delta = toks(shape.tool)
            if rng.random() < retry_p:
                add(cur, delta, role)  # the abandoned attempt: a leaf sharing the whole prompt
            cur = add(cur, delta, role)
        return cur

    system = tuple(rng.randrange(256) for _ in range(shape.system))
    done = 0
    prompt = system
    while done < shape.turns:
        seg = min(shape.compact_every or shape.turns, shape.turns - done)
        last = chain("main", seg, shape.retry_p, prompt)
        done += seg
        if done < shape.turns and shape.compact_every:
            summary = toks(shape.summary)
            add(last, toks((8, 12)), "main-summary", summary)
            prompt = system + summary  # the main agent restarts from the compacted context
    for _ in range(shape.subagents):
        sub = chain("sub-agent", shape.sub_turns, shape.sub_retry_p, toks((60, 120)))
        add(sub, toks((8, 12)), "sub-agent-summary", toks(shape.summary))
    return t
