"""Generated ids -> text and tool calls: streamed and whole answers agree; raw arguments survive; stops trim."""

from __future__ import annotations

import pytest

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer
from opengyre.wire import Outcome, StreamAssembler, TextPiece, ToolPiece, assemble


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return ChatCodec(load_tokenizer())


def _stream(codec: ChatCodec, ids: list[int], outcome: Outcome, stop: list[str], step: int) -> tuple[str, list[str]]:
    asm = StreamAssembler(codec, stop)
    pieces = []
    for i in range(0, len(ids), step):
        pieces += asm.push(ids[i : i + step])
    tail, turn = asm.finish(outcome)
    pieces += tail
    text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    calls = [p.call.arguments for p in pieces if isinstance(p, ToolPiece)]
    assert text == turn.content
    return text, calls


def test_tool_calls_keep_the_models_own_argument_bytes(codec: ChatCodec) -> None:
    ids = codec.encode('Let me look.<tool_call>{"name": "bash", "arguments": {"cmd":   "ls -la"}}</tool_call>')
    ids.append(codec.eos_id)
    out = Outcome(output_ids=ids, finish={"type": "stop", "matched": codec.eos_id})
    turn = assemble(codec, out)
    assert turn.content == "Let me look." and turn.finish == "tool_calls"
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("bash", '{"cmd":   "ls -la"}')]
    for step in (1, 3, 1000):
        assert _stream(codec, ids, out, [], step) == ("Let me look.", ['{"cmd":   "ls -la"}'])


def test_a_malformed_tool_call_stays_text(codec: ChatCodec) -> None:
    ids = codec.encode("a<tool_call>{not json}</tool_call>b")
    turn = assemble(codec, Outcome(output_ids=ids, finish={"type": "length", "length": len(ids)}))
    assert turn.tool_calls == () and turn.content == "a{not json}b" and turn.finish == "length"


def test_stop_strings_are_never_streamed(codec: ChatCodec) -> None:
    ids = codec.encode("hello wor") + codec.encode("ld STOP")
    out = Outcome(output_ids=ids, finish={"type": "stop", "matched": "STOP"})
    for step in (1, 2, 50):
        assert _stream(codec, ids, out, ["STOP"], step) == ("hello world ", [])
    assert assemble(codec, out).content == "hello world "


def test_split_multibyte_characters_come_out_whole(codec: ChatCodec) -> None:
    ids = codec.encode("héllo ✓")
    out = Outcome(output_ids=ids, finish={"type": "length", "length": len(ids)})
    assert _stream(codec, ids, out, [], 1) == ("héllo ✓", [])


def test_the_fast_codec_paths_equal_the_tokenizers_public_api(codec: ChatCodec) -> None:
    from ...proxy._policy import TOOLS, conversation

    tok = codec.tokenizer
    convs = [conversation(0), conversation(2), [{"role": "user", "content": "héllo <|im_end|> ✓"}]]
    for msgs in convs:
        for tools in (None, TOOLS):
            for gen in (True, False):
                slow = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
                assert codec.render(msgs, tools, gen=gen) == slow
            text = codec.render(msgs, tools, gen=True)
            ids = codec.encode(text)
            assert ids == tok(text, add_special_tokens=False).input_ids
            for skip in (True, False):
                assert codec.decode(ids, skip_special=skip) == tok.decode(ids, skip_special_tokens=skip)
    assert codec.decode([0xC3]) == tok.decode([0xC3])  # a lone byte of a multi-byte character
