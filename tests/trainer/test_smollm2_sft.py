"""SFT warm start of SmolLM2-135M-Instruct on a tool-calling reference conversation: a few steps on the ids the
proxy would record, and the real model, served by the CPU engine behind the gateway, makes that tool call
(greedy), parsed back by the ``openai`` SDK as an OpenAI tool call; the gateway records exactly the SFT ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.models import ModelSource, model_state
from opengyre.trainer import (
    Learner,
    pack_samples,
    reload_engines,
    sft_samples,
    sft_trees_from_messages,
    write_checkpoint,
)
from opengyre.trainer.algorithms import SFT
from opengyre.trainer.backends import build_backend
from opengyre.trajectory import TrajectoryTree
from tests.proxy.conftest import make_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a 135M-parameter model on 2 shared cores

M = "opengyre-smollm2-135m"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
REFERENCE: list[dict[str, Any]] = [
    {"role": "user", "content": "Is it raining in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain, 7C"},
    {"role": "assistant", "content": "Yes: rain, 7C."},
]
MAX_STEPS = 20


async def test_sft_steps_make_smollm2_emit_the_reference_tool_call_through_the_gateway(
    smollm2: ModelSource, event_log: EventLog, tmp_path: Path
) -> None:
    [tree] = sft_trees_from_messages(smollm2, [REFERENCE], TOOLS)
    model, _ = smollm2.load()
    backend = build_backend("torch", model.config, model_state(model))
    del model
    learner = Learner(backend, SFT(), lr=4e-5)
    batch = pack_samples(sft_samples([tree]), 4096)
    # Until every target is the argmax with room to spare (a step's NLL, before its update, under 0.02 per token:
    # about 6 steps at this lr).
    nll = [learner.step(batch).metrics["nll"]]
    while nll[-1] > 0.02 and len(nll) < MAX_STEPS:
        nll.append(learner.step(batch).metrics["nll"])
    assert nll[-1] <= 0.02, nll
    ckpt = write_checkpoint(backend, tmp_path, "sft", 1)
    del learner, backend

    assert smollm2.checkpoint is not None
    cfg = EngineConfig(preset="smollm2-135m", model_cache=smollm2.checkpoint.parent, port=0)
    async with EngineServer(cfg) as srv:
        [reload] = await reload_engines([srv.url], ckpt)
        assert reload.success, reload.message
        st = await make_stack(event_log, {"e0": srv}, tokenizer_path=str(smollm2.tokenizer_dir), models=(M,))
        try:
            oai = st.openai("ex-sft")
            msgs: list[Any] = REFERENCE[:1]
            r1 = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=48, temperature=0)  # type: ignore[arg-type]
            c1 = r1.choices[0]
            assert c1.finish_reason == "tool_calls" and c1.message.tool_calls, c1.message
            [tc] = c1.message.tool_calls
            assert tc.type == "function"
            assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Oslo"}
            msgs += [c1.message.model_dump(exclude_none=True), {**REFERENCE[2], "tool_call_id": tc.id}]
            r2 = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=24, temperature=0)  # type: ignore[arg-type]
            assert r2.choices[0].message.content == REFERENCE[3]["content"]
            events = await st.assert_recorded_matches_engines()
        finally:
            await st.gateway.stop()
    # What the gateway recorded for the live conversation is what SFT trained on, token for token.
    assert [e.branch for e in events] == ["root", "extension"]
    recorded = TrajectoryTree("ex-sft")
    for e in events:
        recorded.add(e)
    for mine, e in zip(tree.path("turn-3"), events, strict=True):
        assert tree.prompt(mine) == recorded.prompt(e.call_id), mine
        assert tuple(tree.node(mine).output_ids) == tuple(e.output_ids), mine
