"""SFT on golden trajectories through the same samples, packing and learner as RL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer, model_config
from opengyre.trainer import (
    Learner,
    golden_from_task,
    golden_tree,
    read_conversations,
    run_sft,
    sft_samples,
    sft_samples_from_messages,
)
from opengyre.trainer.algorithms import SFT
from opengyre.trainer.backends import build_backend

CONVO = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def test_golden_tree_shares_the_prefix_and_targets_only_assistant_tokens() -> None:
    tok = load_tokenizer()
    tree = golden_tree("g", CONVO, tok)
    assert len(tree) == 2 and tree.leaves() == ["turn-4"]
    second = tree.node("turn-4")
    assert second.parent_call_id == "turn-2" and second.prefix_len == len(tree.tokens("turn-2"))
    [sample] = sft_samples([tree])
    full = tok.apply_chat_template(CONVO, tokenize=False)
    assert tok.decode(list(sample.tokens)) == full.rstrip("\n")  # the template's trailing newline is a prompt token
    targets = [t for t, m in zip(sample.tokens, sample.targets, strict=True) if m]
    assert tok.decode(targets) == "yo<|im_end|>4<|im_end|>"
    assert sample.token_weight == pytest.approx(1 / len(targets))


def test_golden_from_a_harbor_task(tmp_path: Path) -> None:
    (tmp_path / "solution").mkdir()
    (tmp_path / "instruction.md").write_text("Print 42.\n")
    (tmp_path / "solution" / "solve.sh").write_text("echo 42\n")
    msgs = golden_from_task(tmp_path)
    assert msgs[1]["content"] == "Print 42." and "echo 42" in msgs[2]["content"]
    assert len(golden_tree("t", msgs)) == 1


def test_sft_lowers_the_golden_nll() -> None:
    tok = load_tokenizer()
    trees = [
        golden_tree(f"g{i}", [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}], tok)
        for i, w in enumerate(["apple", "pear", "plum", "fig"])
    ]
    learner = Learner(build_backend("torch", model_config("tiny"), seed=0), SFT(), lr=3e-3)
    results = run_sft(learner, trees, epochs=15, batch_size=4)
    assert results[-1].metrics["nll"] < 0.6 * results[0].metrics["nll"]
    assert results[0].n_targets == sum(len(w) + 1 for w in ["apple", "pear", "plum", "fig"])


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}}}
]
CALL: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
TOOL_CONVO: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "list files"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    {"role": "assistant", "content": "One file: a.py"},
]


def test_tool_calls_are_rendered_as_the_proxy_renders_them_not_flattened() -> None:
    tok = load_tokenizer()
    [sample] = sft_samples_from_messages(tok, [{"messages": TOOL_CONVO, "tools": TOOLS}])
    text = tok.decode(list(sample.tokens))
    # The template's tool block, the Hermes call, the tool result as a <tool_response> turn: the chat codec's.
    assert text == ChatCodec(tok).render(TOOL_CONVO, TOOLS, gen=False).rstrip("\n")
    assert "<tools>" in text and '"cmd": "ls"' in text and "<tool_response>a.py</tool_response>" in text
    targets = [t for t, m in zip(sample.tokens, sample.targets, strict=True) if m]
    assert tok.decode(targets) == (
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call><|im_end|>One file: a.py<|im_end|>'
    )
    # The same conversation with tools passed beside it, or as a bare message list: the same sample.
    assert sft_samples_from_messages("tiny", [TOOL_CONVO], TOOLS) == [sample]


def test_a_conversations_file_with_a_bad_line_is_an_error_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"messages": TOOL_CONVO, "tools": TOOLS}) + "\n\n{oops\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:3: not JSON"):
        read_conversations(f)
    f.write_text(json.dumps({"messages": TOOL_CONVO, "tools": TOOLS}) + "\n")
    assert read_conversations(f) == [{"messages": TOOL_CONVO, "tools": TOOLS}]
