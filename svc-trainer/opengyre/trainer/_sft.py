"""SFT on the same pipeline: golden trajectories become trees, trees become samples, the SFT algorithm trains.

A golden trajectory is an OpenAI-format conversation (system, user, assistant with ``tool_calls``, ``tool``
results; with the tools offered) whose assistant turns are the targets: a synthesized task's reference solution,
or a high-reward execution. It becomes the tree the proxy would have recorded had the policy produced it
(``opengyre.tito.replay_conversation``: the gateway's parsing, TITO planning and chat codec), so the trained ids
are exactly the ids the policy sees and emits behind the gateway: the same template, the same tool block in the
system prompt, the same ``<tool_call>{json}</tool_call>`` text, the same tool-result turns, and each turn's
prompt extending the previous call's ids rather than a re-tokenization of the whole conversation. Only the
assistant turns' ids (their end-of-turn token included) are targets; every path is used and every shared token
is a target once.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from opengyre.models import ModelSource, load_tokenizer, model_state, resolve_model
from opengyre.trajectory import Node, TrajectoryTree

from ._packing import pack_samples
from ._samples import TrainingSample, execution_samples
from ._sampling import PathSampler
from ._step import Learner, StepResult

__all__ = [
    "DEFAULT_SFT_LR",
    "PRETRAINED_SFT_LR",
    "Conversation",
    "SftRun",
    "golden_from_task",
    "golden_tree",
    "read_conversations",
    "run_sft",
    "sft_samples",
    "sft_samples_from_messages",
    "sft_trees_from_messages",
    "sft_warm_start",
]

Message = Mapping[str, Any]
DEFAULT_SFT_LR = 1e-3
PRETRAINED_SFT_LR = 1e-5
Tools = Sequence[Mapping[str, Any]]
# A message list, or one line of OpenAI's fine-tuning JSONL: ``{"messages": [...], "tools": [...]}``.
Conversation = Sequence[Message] | Mapping[str, Any]


def golden_tree(
    execution_id: str,
    messages: Sequence[Message],
    tokenizer: PreTrainedTokenizerFast | None = None,
    tools: Tools | None = None,
) -> TrajectoryTree:
    """One node per assistant message, as the proxy would record the conversation (see the module doc)."""
    from opengyre.chat import ChatCodec
    from opengyre.tito import replay_conversation

    codec = ChatCodec(tokenizer or load_tokenizer())
    tools_list = [dict(t) for t in tools] if tools else None
    tree = TrajectoryTree(execution_id)
    for n in replay_conversation(codec, [dict(m) for m in messages], tools_list, execution_id=execution_id):
        out = tuple(int(t) for t in n.out)
        tree.add(
            Node(
                call_id=n.call_id,
                parent_call_id=n.parent,
                prefix_len=n.prefix_len,
                prompt_delta_ids=tuple(int(t) for t in n.delta),
                output_ids=out,
                output_logprobs=(0.0,) * len(out),
                role=n.role,
                temperature=1.0,  # nothing was sampled: the NLL is of the model's own distribution
            )
        )
    return tree


def _split(conversation: Conversation, tools: Tools | None) -> tuple[Sequence[Message], Tools | None]:
    if isinstance(conversation, Mapping):
        if not isinstance(conversation.get("messages"), list):
            raise ValueError("a conversation object needs a 'messages' list")
        own = conversation.get("tools")
        return conversation["messages"], own if own is not None else tools
    return conversation, tools


def _tokenizer(model: str | ModelSource | PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    if isinstance(model, PreTrainedTokenizerFast):
        return model
    return (resolve_model(model) if isinstance(model, str) else model).tokenizer()


def sft_trees_from_messages(
    model: str | ModelSource | PreTrainedTokenizerFast,
    conversations: Sequence[Conversation],
    tools: Tools | None = None,
    *,
    prefix: str = "sft",
) -> list[TrajectoryTree]:
    """One tree per conversation (execution id ``<prefix>-<i>``); ``tools`` for those without their own."""
    tok = _tokenizer(model)
    out = []
    for i, c in enumerate(conversations):
        msgs, t = _split(c, tools)
        out.append(golden_tree(f"{prefix}-{i}", msgs, tok, t))
    return out


def sft_samples_from_messages(
    model: str | ModelSource | PreTrainedTokenizerFast,
    conversations: Sequence[Conversation],
    tools: Tools | None = None,
) -> list[TrainingSample]:
    """SFT samples of OpenAI-format conversations for ``model`` (a ``--model`` name, a resolved model or its
    tokenizer): the ids the proxy would record, targets exactly the assistant turns' ids."""
    return sft_samples(sft_trees_from_messages(model, conversations, tools))


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


def read_conversations(path: Path) -> list[dict[str, Any]]:
    """A JSONL file of conversations, one ``{"messages": [...], "tools": [...]}`` object a line (OpenAI's
    fine-tuning format; ``tools`` optional); a bad line is an error naming the file and the line."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            raise ValueError(f'{path}:{n}: expected an object with a "messages" list')
        if obj.get("tools") is not None and not isinstance(obj["tools"], list):
            raise ValueError(f'{path}:{n}: "tools" must be a list')
        out.append(obj)
    return out


@dataclass(frozen=True)
class SftRun:
    checkpoint: Path
    version: str
    digest: str
    steps: list[StepResult]


def sft_warm_start(
    model: str | ModelSource,
    conversations: Sequence[Conversation],
    out: Path,
    *,
    tools: Tools | None = None,
    backend: str = "torch",
    epochs: int = 3,
    batch_size: int = 8,
    lr: float | None = None,
    seed: int = 0,
    version: str = "sft",
) -> SftRun:
    """Fine-tune ``model`` on the conversations and write the checkpoint to ``out`` (what ``opengyre train sft``
    runs): a warm start the engine serves (``--checkpoint``) and RL continues from (``--init-checkpoint``).

    ``lr`` by default: ``DEFAULT_SFT_LR`` for a preset trained from its seeded init, ``PRETRAINED_SFT_LR`` for a
    pretrained model (a large step would wreck what it knows).
    """
    from ._publish import export_checkpoint
    from .algorithms import SFT
    from .backends import build_backend

    source = resolve_model(model) if isinstance(model, str) else model
    if lr is None:
        lr = DEFAULT_SFT_LR if source.preset is not None else PRETRAINED_SFT_LR
    trees = sft_trees_from_messages(source, conversations, tools, prefix="golden")
    weights, _ = source.load(seed=seed)  # a preset's seeded init, or a pretrained model's weights
    learner = Learner(build_backend(backend, weights.config, model_state(weights), seed=seed), SFT(), lr=lr)
    steps = run_sft(learner, trees, epochs=epochs, batch_size=batch_size, seed=seed)
    digest = export_checkpoint(learner.backend, Path(out), version)
    return SftRun(Path(out), version, digest, steps)
