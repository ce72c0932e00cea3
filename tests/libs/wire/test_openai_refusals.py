"""OpenAI fields this server cannot honour are refused with a 400 naming the field, never silently ignored."""

from __future__ import annotations

from typing import Any

import pytest

from opengyre.wire import ApiError
from opengyre.wire.openai import parse_chat, parse_completion

M = "opengyre-tiny"


def _refused(parse: Any, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"best_of": 2, "n": 1}, "best_of"),
        ({"suffix": "tail"}, "suffix"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ],
)
def test_completions_fields_it_cannot_honour_are_refused(extra: dict[str, Any], param: str) -> None:
    err = _refused(parse_completion, {"model": M, "prompt": "hi", **extra})
    assert err.param == param and param in str(err)


def test_completions_fields_it_honours_as_asked_are_accepted() -> None:
    # best_of equal to n, an empty suffix, echo alone and logprobs alone mean nothing this server does not do
    for extra in ({"best_of": 2, "n": 2}, {"suffix": ""}, {"echo": True}, {"logprobs": 2}, {"best_of": None}):
        req = parse_completion({"model": M, "prompt": "hi", **extra})
        assert req.model == M


def test_a_chat_tool_message_without_its_call_id_is_refused_naming_the_message() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "a b"},
    ]
    err = _refused(parse_chat, {"model": M, "messages": msgs})
    assert err.param == "messages[2].tool_call_id"
    msgs[2]["tool_call_id"] = ""
    assert _refused(parse_chat, {"model": M, "messages": msgs}).param == "messages[2].tool_call_id"
    msgs[2]["tool_call_id"] = "c1"
    assert parse_chat({"model": M, "messages": msgs}).model == M
