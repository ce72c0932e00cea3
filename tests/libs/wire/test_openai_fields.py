"""Chat Completions and Completions top-level fields: every one the OpenAI SDK can send (its
``ChatCompletionCreateParams`` / ``CompletionCreateParams``, deprecated ones included) is known here, honoured,
refused naming it, or recorded as no-effect; any other is OpenAI's 400 "Unrecognized request argument supplied"
naming it, never ignored (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from opengyre.wire import ApiError
from opengyre.wire.openai import error_body, parse_chat, parse_completion

M = "opengyre-tiny"
CHAT: dict[str, Any] = {"model": M, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, Any] = {"model": M, "prompt": "hi"}


def sdk_fields(params: type) -> set[str]:
    """The request's top-level fields as the installed SDK declares them (its TypedDicts' keys), ``stream`` too."""
    fields: set[str] = set()
    for cls in (params.CompletionCreateParamsBase, params.CompletionCreateParamsStreaming):  # type: ignore[attr-defined]
        fields |= set(cls.__annotations__)
        for base in getattr(cls, "__orig_bases__", ()):
            fields |= set(getattr(base, "__annotations__", {}))
    return fields


@pytest.mark.parametrize(
    ("parse", "base"), [(parse_chat, CHAT), (parse_completion, COMPLETION)], ids=["chat", "completions"]
)
@pytest.mark.parametrize("field", ["max_token", "temprature", "response_schema", "guided_json", "x"])
def test_an_unknown_field_is_a_400_naming_it(parse: Any, base: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as info:
        parse({**base, field: 1})
    err = info.value
    assert err.status == 400 and err.param == field
    body = error_body(err)["error"]
    assert body["message"] == f"Unrecognized request argument supplied: {field}"
    assert body["type"] == "invalid_request_error" and body["param"] == field


@pytest.mark.parametrize(
    ("parse", "base", "params"),
    [(parse_chat, CHAT, chat_create_params), (parse_completion, COMPLETION, completion_create_params)],
    ids=["chat", "completions"],
)
def test_every_field_the_sdk_sends_is_known(parse: Any, base: dict[str, Any], params: type) -> None:
    """Each of the SDK's fields, sent as null, is not "unrecognized" (it may be refused as a null where the SDK
    types it non-nullable: that is the field's own check); a field the SDK adds later fails here until handled."""
    fields = sdk_fields(params) - set(base)
    assert {"max_tokens", "stream", "user"} <= fields, fields  # the SDK's declaration was read
    for field in sorted(fields):
        try:
            parse({**base, field: None})
        except ApiError as err:
            assert err.param == field and "Unrecognized" not in err.message, (field, err.message)


def test_sdk_fields_without_effect_here_are_recorded_as_such_and_the_ones_it_cannot_honour_refused() -> None:
    req = parse_chat({**CHAT, "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"}, "user": "u"})
    assert set(req.no_effect) == {"prompt_cache_retention", "prompt_cache_options", "user"}
    assert set(parse_completion({**COMPLETION, "user": "u"}).no_effect) == {"user"}
    with pytest.raises(ApiError) as info:
        parse_chat({**CHAT, "moderation": {"input": {"mode": "block"}}})
    assert info.value.param == "moderation"


def test_the_engine_extras_are_honoured_on_both() -> None:
    extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 2, "stop_token_ids": [7]}
    for parse, base in ((parse_chat, CHAT), (parse_completion, COMPLETION)):
        sp = parse({**base, **extras, "ignore_eos": True, "skip_special_tokens": False}).sampling
        assert sp["top_k"] == 5 and sp["min_new_tokens"] == 2 and sp["stop_token_ids"] == [7]
        assert sp["ignore_eos"] is True and sp["skip_special_tokens"] is False
