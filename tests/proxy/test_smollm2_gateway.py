"""The real model behind the proxy: a multi-turn conversation with tools through the official ``openai`` and
``anthropic`` SDKs, recorded as the engine's own ids, each turn extending the previous call token by token."""

from __future__ import annotations

from typing import Any

import pytest

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.models import ModelSource

from ..libs.tito.test_smollm2 import TOOLS
from .conftest import make_stack

M = "opengyre-smollm2-135m"  # the engine's default served name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a 135M-parameter model on 2 shared cores


async def test_sdk_conversation_with_tools_against_smollm2(event_log: EventLog, smollm2: ModelSource) -> None:
    assert smollm2.checkpoint is not None
    cfg = EngineConfig(preset="smollm2-135m", model_cache=smollm2.checkpoint.parent, port=0)
    async with EngineServer(cfg) as srv:
        st = await make_stack(event_log, {"e0": srv}, tokenizer_path=str(smollm2.tokenizer_dir), models=(M,))
        try:
            oai = st.openai("ex-smol")
            msgs: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
            r1 = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=6, temperature=0)  # type: ignore[arg-type]
            msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Thanks!"}]
            await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=4, temperature=0)  # type: ignore[arg-type]
            ant = st.anthropic("ex-smol-ant")
            m1 = await ant.messages.create(
                model=M,
                max_tokens=4,
                tools=[{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}],
                messages=[{"role": "user", "content": "Hi"}],
                extra_body={"temperature": 0},
            )
            assert m1.content
            events = await st.assert_recorded_matches_engines()
            assert [e.branch for e in events] == ["root", "extension", "root"]
        finally:
            await st.gateway.stop()
