"""SFT on the same pipeline: golden trajectories become trees, trees become samples, the SFT algorithm trains.

A golden trajectory is a conversation whose assistant turns are the targets (a synthesized task's reference
solution, or a high-reward execution). Each assistant turn is a node whose prompt is the chat template
rendered up to that turn, so it shares its prefix with the turn before exactly as the proxy's trees do;
every path is used and every shared token is a target once.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opengyre.models import load_tokenizer
from opengyre.trajectory import Node, TrajectoryTree

from ._packing import pack_samples
from ._samples import TrainingSample, execution_samples
from ._sampling import PathSampler
from ._step import Learner, StepResult

__all__ = ["golden_from_task", "golden_tree", "run_sft", "sft_samples"]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def golden_tree(execution_id: str, messages: Sequence[Mapping[str, Any]], tokenizer: Any = None) -> TrajectoryTree:
    """One node per assistant message: prompt = the template up to it, output = its content + the eos."""
    tok = tokenizer or load_tokenizer()
    eos = tok.eos_token_id  # the template's end of turn (<|im_end|>), in whichever vocabulary
    tree = TrajectoryTree(execution_id)
    parent: str | None = None
    parent_tokens: tuple[int, ...] = ()
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        history = [{str(k): str(v) for k, v in x.items()} for x in messages[:i]]
        text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        prompt = tuple(tok.encode(text, add_special_tokens=False))
        output = (*tok.encode(str(m.get("content", "")), add_special_tokens=False), eos)
        prefix = _common_prefix(parent_tokens, prompt) if parent is not None else 0
        call_id = f"turn-{i}"
        tree.add(
            Node(
                call_id=call_id,
                parent_call_id=parent,
                prefix_len=prefix,
                prompt_delta_ids=prompt[prefix:],
                output_ids=output,
                output_logprobs=(0.0,) * len(output),
                role=str(m.get("trajectory_role", "main")),  # type: ignore[arg-type]
                temperature=1.0,  # nothing was sampled: the NLL is of the model's own distribution
            )
        )
        parent, parent_tokens = call_id, tree.tokens(call_id)
    if not len(tree):
        raise ValueError(f"golden trajectory {execution_id} has no assistant turn")
    return tree


def golden_from_task(task_dir: Path) -> list[dict[str, str]]:
    """A Harbor task's reference solution as a golden conversation: instruction in, ``solve.sh`` out."""
    task_dir = Path(task_dir)
    instruction = (task_dir / "instruction.md").read_text().strip()
    solution = (task_dir / "solution" / "solve.sh").read_text().strip()
    return [
        {"role": "system", "content": "You solve tasks in a Linux shell. Answer with one bash script."},
        {"role": "user", "content": instruction},
        {"role": "assistant", "content": f"```bash\n{solution}\n```"},
    ]


def sft_samples(trees: Sequence[TrajectoryTree]) -> list[TrainingSample]:
    """Every path of every tree, shared tokens once, each trajectory weighing the same."""
    out: list[TrainingSample] = []
    sampler = PathSampler(None)
    for t in trees:
        drawn = sampler.sample(t, random.Random(0))  # unbounded: the order does not change which tokens train
        out += execution_samples(t.execution_id, drawn, advantage=1.0, execution_share=1.0 / len(trees))
    return out


def run_sft(
    learner: Learner,
    trees: Sequence[TrajectoryTree],
    *,
    epochs: int = 1,
    batch_size: int = 8,
    micro_batch_tokens: int = 4096,
    seed: int = 0,
) -> list[StepResult]:
    """Mini-batch SFT: each step sees ``batch_size`` trajectories (weights re-normalised within the step)."""
    rng = random.Random(seed)
    results: list[StepResult] = []
    for _ in range(epochs):
        order = list(trees)
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            samples = sft_samples(order[i : i + batch_size])
            results.append(learner.step(pack_samples(samples, micro_batch_tokens)))
    return results
