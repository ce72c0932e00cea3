"""A reference conversation replayed as the proxy records it: the SFT samples of a conversation are the ids the
gateway recorded when a real engine produced that conversation (tool calls included), call by call."""

from __future__ import annotations

from typing import Any

import pytest

from opengyre.chat import ChatCodec
from opengyre.models import ModelSource, load_tokenizer
from opengyre.tito import replay_conversation
from opengyre.trainer import golden_tree, sft_samples, sft_samples_from_messages
from opengyre.trajectory import TrajectoryTree

from ._policy import TOOL_OUTPUT, TOOLS, conversation
from .conftest import Stack

M = "opengyre-tiny"


async def test_sft_tree_of_a_conversation_equals_what_the_gateway_recorded_for_it(tool_stack: Stack) -> None:
    oai = tool_stack.openai("ex-replay")
    msgs: list[Any] = conversation(0)
    for _ in range(2):  # two tool round trips, each reply the engine's own (greedy)
        r = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
        reply = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and reply.tool_calls
        msgs += [
            reply.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": TOOL_OUTPUT},
        ]
    events = await tool_stack.assert_recorded_matches_engines()  # recorded ids are the engine's
    assert [e.branch for e in events] == ["root", "extension"]

    # The conversation as a reference trajectory: the SFT tree has the recorded tree's ids, node for node.
    recorded = TrajectoryTree("ex-replay")
    for e in events:
        recorded.add(e)
    tree = golden_tree("ex-replay", msgs, load_tokenizer(), TOOLS)
    assert tree.path("turn-4") == ["turn-2", "turn-4"]
    for mine, e in zip(tree.path("turn-4"), events, strict=True):
        assert tree.prompt(mine) == recorded.prompt(e.call_id), mine
        assert tuple(tree.node(mine).output_ids) == tuple(e.output_ids), mine
        assert tree.node(mine).prefix_len == e.prefix_len, mine
    # Targets: exactly the assistant turns' ids, the end-of-turn token included; the tool block is prompt.
    [sample] = sft_samples([tree])
    assert sample.tokens == recorded.tokens(events[1].call_id)
    tok = load_tokenizer()
    spans = _runs(sample.targets)
    assert [tok.decode(list(sample.tokens[a:b])) for a, b in spans] == [
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call><|im_end|>'
    ] * 2
    assert "<tools>" in tok.decode(list(sample.tokens[: spans[0][0]]))


def _runs(mask: tuple[bool, ...]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and (not out or out[-1][1] != i):
            out.append((i, i + 1))
        elif m:
            out[-1] = (out[-1][0], i + 1)
    return out


def test_a_reply_the_template_writes_as_text_and_tags_is_tokenized_on_its_own() -> None:
    codec = ChatCodec(load_tokenizer())
    call = {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    ids = codec.reply_ids(conversation(0), {"role": "assistant", "content": "", "tool_calls": [call]}, TOOLS)
    assert ids[-1] == codec.eos_id
    assert codec.decode(ids, skip_special=False) == (
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call><|im_end|>'
    )


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([{"role": "user", "content": "hi"}], "has no assistant turn"),
        ([{"role": "assistant", "content": "hi"}], "starts with an assistant turn"),
        ([{"role": "robot", "content": "hi"}], "role"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"function": {}}]}], "malformed"),
    ],
)
def test_a_conversation_the_gateway_would_refuse_is_an_error(messages: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        replay_conversation(ChatCodec(load_tokenizer()), messages, execution_id="bad")


def test_smollm2_sft_targets_are_exactly_its_assistant_spans(smollm2: ModelSource) -> None:
    """With a real BPE vocabulary (no tool tokens): the tool call is text, the targets are the two replies and their
    end tokens, the rest — tool block, tool result turn, the newline after each end token — is prompt."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    convo: list[dict[str, Any]] = [
        {"role": "user", "content": "Is it raining in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain, 7C"},
        {"role": "assistant", "content": "Yes: rain, 7C."},
    ]
    codec = ChatCodec(smollm2.tokenizer())
    [sample] = sft_samples_from_messages(smollm2, [convo], tools)
    assert list(sample.tokens) == codec.encode(codec.render(convo, tools, gen=False).rstrip("\n"))
    assert [codec.decode(list(sample.tokens[a:b]), skip_special=False) for a, b in _runs(sample.targets)] == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
        "Yes: rain, 7C.<|im_end|>",
    ]
