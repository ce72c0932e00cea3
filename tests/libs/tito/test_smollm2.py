"""TITO and tool calls with a real BPE tokenizer and chat template (SmolLM2-135M-Instruct's): its vocabulary has
no tool tokens, so Hermes ``<tool_call>`` tags are text the assembler finds in the decoded stream; BPE merges
make naive re-tokenization of the model's own reply differ from the ids it emitted, which TITO detects, counts
and never trains on. Only the tokenizer is loaded here."""

from __future__ import annotations

from typing import Any

import pytest

from opengyre.chat import ChatCodec
from opengyre.models import ModelSource
from opengyre.tito import ExecutionTrajectory
from opengyre.wire import Outcome, StreamAssembler, TextPiece, ToolPiece, assemble

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(scope="module")
def codec(smollm2: ModelSource) -> ChatCodec:
    return ChatCodec(smollm2.tokenizer())


def _stop(codec: ChatCodec, ids: list[int]) -> Outcome:
    return Outcome(output_ids=ids, finish={"type": "stop", "matched": codec.eos_id})


def test_tools_are_rendered_into_the_system_prompt_and_the_turn_ends_at_im_end(codec: ChatCodec) -> None:
    assert codec.tool_start is None  # tags are plain text in this vocabulary
    text = codec.render([{"role": "user", "content": "Weather in Paris?"}], TOOLS, gen=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert text.endswith("<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert codec.tokenizer.convert_ids_to_tokens(codec.eos_id) == "<|im_end|>"
    assert codec.decode(codec.turn_close_ids) == "\n"


def test_a_hermes_tool_call_in_bpe_text_is_parsed_streamed_or_whole(codec: ChatCodec) -> None:
    emitted = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city":  "Paris"}}\n</tool_call>'
    ids = codec.encode(emitted)
    assert len(ids) > 20 and codec.tokenizer.convert_ids_to_tokens(ids[5]) != "<tool_call>"  # split into pieces
    turn = assemble(codec, _stop(codec, ids))
    assert turn.finish == "tool_calls" and turn.content == "Let me check.\n"
    [call] = turn.tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city":  "Paris"}')  # the model's bytes, kept
    # One token at a time, as the engine streams: the same text and the same call, the tag never leaks.
    asm = StreamAssembler(codec)
    pieces: list[TextPiece | ToolPiece] = []
    for t in ids:
        pieces += asm.push([t])
    rest, streamed = asm.finish(_stop(codec, ids))
    pieces += rest
    text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    assert text == "Let me check.\n" and "<" not in text
    assert [(p.call.name, p.call.arguments) for p in pieces if isinstance(p, ToolPiece)] == [
        ("get_weather", '{"city":  "Paris"}')
    ]
    assert streamed.finish == "tool_calls"


@pytest.mark.parametrize(
    ("emitted", "kind", "finish"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>', "stop", "stop"),
        ("<tool_call>\nget_weather(Paris)\n</tool_call>", "stop", "stop"),
        ('Sure <tool_call>\n{"name": "get_weather", "argu', "length", "length"),
    ],
    ids=["broken-json", "not-json", "cut-off"],
)
def test_malformed_tool_calls_from_a_weak_model_come_back_as_text(
    codec: ChatCodec, emitted: str, kind: str, finish: str
) -> None:
    ids = codec.encode(emitted)
    outcome = Outcome(output_ids=ids, finish={"type": kind})
    turn = assemble(codec, outcome)
    assert turn.tool_calls == () and turn.finish == finish
    assert turn.content == emitted  # recorded as emitted, tags included


def _commit(t: ExecutionTrajectory, msgs: list[dict[str, Any]], cid: str, out: list[int], reply: dict[str, Any]) -> Any:
    plan = t.plan(msgs, TOOLS)
    t.commit(plan, cid, out, reply, "main")
    return plan


def test_bpe_drift_of_the_models_own_reply_is_detected_and_never_trained_on(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "user", "content": "Weather in Paris?"}]
    # The model sampled "Paris" as two pieces: a valid spelling, but not the one BPE's merges produce.
    par, is_ = codec.encode("Par"), codec.encode("is")
    assert codec.encode("Paris") != par + is_
    out = codec.encode("It is sunny in ") + par + is_ + codec.encode(".") + [codec.eos_id]
    reply = {"role": "assistant", "content": "It is sunny in Paris."}
    p1 = _commit(t, m1, "c1", out, reply)
    m2 = [*m1, reply, {"role": "user", "content": "And tomorrow?"}]
    p2 = t.plan(m2, TOOLS)
    assert p2.branch == "extension" and p2.parent_call_id == "c1"
    # The prompt continues the ids the engine produced, token by token...
    assert p2.prompt_ids[: len(p1.prompt_ids) + len(out)] == p1.prompt_ids + out
    # ...while re-tokenizing the same text would not: detected, with its position.
    fresh = codec.render_ids(m2, TOOLS)
    assert p2.prompt_ids != fresh
    assert p2.drift is not None and p2.drift.kind == "retokenization"
    assert p2.prompt_ids[: p2.drift.position] == fresh[: p2.drift.position]
    t.commit(p2, "c2", [*codec.encode("Rain."), codec.eos_id], {"role": "assistant", "content": "Rain."}, "main")
    assert t.drift_count == 1


def test_a_tool_call_the_harness_re_serializes_is_drift_not_new_tokens(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "user", "content": "Weather in Paris?"}]
    emitted = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    out = [*codec.encode(emitted), codec.eos_id]
    turn = assemble(codec, _stop(codec, out))
    [call] = turn.tool_calls
    p1 = _commit(t, m1, "c1", out, turn.message())
    # An OpenAI harness sends the call back with its arguments re-serialized ({"city": "Paris"}).
    back = {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    m2 = [
        *m1,
        {"role": "assistant", "content": "", "tool_calls": [back]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    p2 = t.plan(m2, TOOLS)
    assert p2.branch == "extension" and p2.prompt_ids[: len(p1.prompt_ids) + len(out)] == p1.prompt_ids + out
    assert p2.drift is not None and p2.drift.kind == "retokenization"
    assert codec.decode(p2.delta_ids, skip_special=False).startswith("\n<|im_start|>user\n<tool_response>\nsunny")
