"""A tool-using policy for tests: the tiny model, trained for a few seconds to call a tool.

For the scripted conversations below it emits ``<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>``
(then eos) after every turn. Greedy decoding then makes the real CPU engine behave like an agent policy on
those conversations, so tool-call paths run end to end without scripting the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from opengyre.models import build_model, load_tokenizer, model_config, save_checkpoint

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "bash", "description": "run a command", "parameters": {"type": "object"}},
    }
]
SYSTEM = "You are an agent."
USER = "list files"
TOOL_OUTPUT = "a.py b.txt"
TOOL_CALL = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call><|im_end|>'


def conversation(turns: int) -> list[dict[str, Any]]:
    """The scripted conversation after ``turns`` tool round trips (OpenAI-shaped messages)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": TOOL_OUTPUT})
    return msgs


def train_tool_policy(directory: Path, *, turns: int = 2, max_steps: int = 600, seed: int = 0) -> Path:
    """Train until greedy decoding emits the tool call with a clear margin at every position.

    A fixed step count is not enough: CPUs with different vector units round differently, and a near-tie at
    one position would make the engine decode something else. The margin makes the result hold everywhere.
    """
    tok = load_tokenizer()
    model = build_model(model_config("tiny"), seed=seed)
    model.train()
    seqs = []
    target = tok(TOOL_CALL, add_special_tokens=False).input_ids
    for t in range(turns):
        prompt = tok.apply_chat_template(conversation(t), tools=TOOLS, add_generation_prompt=True, tokenize=False)
        p = tok(prompt, add_special_tokens=False).input_ids
        ids = torch.tensor(p + target)
        labels = torch.full_like(ids, -100)
        labels[len(p) :] = ids[len(p) :]
        seqs.append((ids, labels))
    n = max(len(x) for x, _ in seqs)
    ids = torch.stack([torch.nn.functional.pad(x, (0, n - len(x)), value=256) for x, _ in seqs])
    labels = torch.stack([torch.nn.functional.pad(y, (0, n - len(y)), value=-100) for _, y in seqs])
    attn = (torch.arange(n) < torch.tensor([len(x) for x, _ in seqs]).unsqueeze(1)).long()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(max_steps):
            out = model(input_ids=ids, attention_mask=attn, labels=labels)
            if step % 10 == 0 and _margin(out.logits.detach(), labels) > MARGIN:
                break
            opt.zero_grad()
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # no loss spikes: they undo what was learnt
            opt.step()
        else:
            raise AssertionError(f"the tool policy did not learn the call in {max_steps} steps")
    model.eval()
    save_checkpoint(model, directory, "tool-policy")
    return directory


MARGIN = 2.0  # logits: target over the runner-up at every labelled position


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The smallest lead of the target token over the best other token, over all labelled positions."""
    pred, gold = logits[:, :-1], labels[:, 1:]
    mask = gold != -100
    tgt = pred.gather(-1, gold.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    other = pred.scatter(-1, gold.clamp(min=0).unsqueeze(-1), float("-inf")).amax(-1)
    return float((tgt - other)[mask].min())
