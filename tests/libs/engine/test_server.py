"""The CPU engine over HTTP: SGLang's native API (generate, stream, abort, weight reload), OpenAI routes,
continuous batching, and the request log tests compare the proxy's records against."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from opengyre.config import HttpLimits
from opengyre.engine import EngineConfig, EngineProcess, EngineServer, SamplingParams
from opengyre.models import build_model, load_checkpoint, model_config, save_checkpoint, token_logprobs
from opengyre.runtime import cmdline

from ..._polling import await_until

PROMPT = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97, 115, 115, 10]


async def _stream(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with c.stream("POST", url + "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


async def test_generate_speaks_sglangs_native_shape(engine_a: EngineServer) -> None:
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(
            engine_a.url + "/generate",
            json={
                "rid": "r-1",
                "input_ids": PROMPT,
                "sampling_params": {"max_new_tokens": 6, "sampling_seed": 1},
                "return_logprob": True,
            },
        )
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert meta["id"] == "r-1" and meta["prompt_tokens"] == len(PROMPT) and meta["weight_version"] == "default"
    ids = body["output_ids"]
    assert len(ids) == meta["completion_tokens"] and 1 <= len(ids) <= 6
    assert [e[1] for e in meta["output_token_logprobs"]] == ids
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    fin = meta["finish_reason"]
    assert fin == {"type": "length", "length": 6} or (fin["type"] == "stop" and fin["matched"] == ids[-1] == 258)
    # Behaviour logprobs (temperature 1) are the trainer's recomputation of the same tokens.
    ref = token_logprobs(engine_a.engine.model, torch.tensor([PROMPT + ids]))[0, len(PROMPT) - 1 :]
    assert torch.allclose(torch.tensor([e[0] for e in meta["output_token_logprobs"]]), ref, atol=1e-4)
    rec = engine_a.engine.request_log("r-1")[0]
    assert list(rec.input_ids) == PROMPT and list(rec.output_ids) == ids


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"input_ids": [1, 2], "sampling_params": {"bogus": 1}}, 400, "bogus"),
        ({"sampling_params": {}}, 400, "Either text, input_ids or input_embeds"),
        ({"input_ids": [1, 99999]}, 400, "input_ids"),
        ({"input_ids": list(range(200)) * 2}, 400, "context length"),
    ],
)
async def test_bad_requests_get_400(body: dict[str, Any], status: int, needle: str) -> None:
    async with EngineServer(EngineConfig(port=0, context_length=300)) as srv, httpx.AsyncClient() as c:
        r = await c.post(srv.url + "/generate", json=body)
        assert r.status_code == status
        assert needle in r.text
        assert srv.engine.request_log() == []


async def test_every_native_route_answers_400_to_a_body_that_is_not_json(engine_a: EngineServer) -> None:
    routes = ["/generate", "/abort_request", "/update_weights_from_disk", "/update_weight_version", "/pause_generation"]
    async with httpx.AsyncClient(timeout=60) as c:
        for path in routes:
            r = await c.post(engine_a.url + path, content=b"{")
            assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"], path
        assert (await c.post(engine_a.url + "/pause_generation", json=["abort"])).status_code == 400
    assert not engine_a.engine.scheduler.paused and engine_a.engine.request_log() == []


async def test_streams_are_cumulative_and_end_with_done(engine_a: EngineServer) -> None:
    async with httpx.AsyncClient(timeout=60) as c:
        chunks = await _stream(
            c,
            engine_a.url,
            {
                "input_ids": PROMPT,
                "sampling_params": {"max_new_tokens": 12, "ignore_eos": True},
                "return_logprob": True,
            },
        )
    assert len(chunks) >= 2
    for a, b in itertools.pairwise(chunks):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert a["meta_info"]["finish_reason"] is None
    last = chunks[-1]
    assert len(last["output_ids"]) == 12 and last["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert len(last["meta_info"]["output_token_logprobs"]) == 12


async def test_abort_matches_rid_prefixes_and_returns_partial_output(engine_a: EngineServer) -> None:
    long = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    async with httpx.AsyncClient(timeout=60) as c:
        tasks = [
            asyncio.create_task(c.post(engine_a.url + "/generate", json={**long, "rid": rid}))
            for rid in ("grp-1", "grp-2")
        ]
        short = asyncio.create_task(
            c.post(
                engine_a.url + "/generate",
                json={
                    "input_ids": PROMPT,
                    "rid": "other",
                    "sampling_params": {"max_new_tokens": 30, "ignore_eos": True},
                },
            )
        )
        await await_until(
            lambda: engine_a.engine.scheduler.steps >= 5,
            "the engine stepped five times",
            polls=12000,
            every=0.01,
        )
        assert (await c.post(engine_a.url + "/abort_request", json={"rid": "grp"})).status_code == 200
        done = [await t for t in tasks]
        other = (await short).json()
    for r in done:
        assert r.status_code == 200
        body = r.json()
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(body["output_ids"]) < 4000
    assert other["meta_info"]["finish_reason"] == {"type": "length", "length": 30}


async def test_weights_reload_from_disk_and_every_response_says_which(engine_a: EngineServer, tmp_path: Path) -> None:
    new = build_model(model_config("tiny"), seed=11)
    save_checkpoint(new, tmp_path / "ckpt", "step-7")
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0}, "return_logprob": True}
    async with httpx.AsyncClient(timeout=60) as c:
        before = (await c.post(engine_a.url + "/generate", json=body)).json()
        r = await c.post(engine_a.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "ckpt")})
        assert r.status_code == 200 and r.json()["success"] is True
        info = (await c.get(engine_a.url + "/model_info")).json()
        after = (await c.post(engine_a.url + "/generate", json=body)).json()
        bad = await c.post(engine_a.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")})
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert before["meta_info"]["weight_version"] == "default"
    assert info["weight_version"] == after["meta_info"]["weight_version"] == "step-7"
    model, _ = load_checkpoint(tmp_path / "ckpt")
    ids = after["output_ids"]
    ref = token_logprobs(model, torch.tensor([PROMPT + ids]))[0, len(PROMPT) - 1 :]
    got = torch.tensor([e[0] for e in after["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, ref, atol=1e-4)


async def test_concurrent_requests_share_decode_steps(engine_a: EngineServer) -> None:
    n, k = 8, 16
    steps0 = engine_a.engine.scheduler.steps
    async with httpx.AsyncClient(timeout=60) as c:
        rs = await asyncio.gather(
            *(
                c.post(
                    engine_a.url + "/generate",
                    json={"input_ids": [*PROMPT, i], "sampling_params": {"max_new_tokens": k, "ignore_eos": True}},
                )
                for i in range(n)
            )
        )
    assert all(len(r.json()["output_ids"]) == k for r in rs)
    # Sequentially this takes n*k steps; continuous batching runs them together.
    assert engine_a.engine.scheduler.steps - steps0 < n * k / 2


async def test_prefix_cache_reports_cached_tokens(engine_a: EngineServer) -> None:
    body = {"input_ids": PROMPT * 3, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    async with httpx.AsyncClient(timeout=60) as c:
        first = (await c.post(engine_a.url + "/generate", json=body)).json()
        ext = {**body, "input_ids": PROMPT * 3 + first["output_ids"] + [10, 257]}
        second = (await c.post(engine_a.url + "/generate", json=ext)).json()
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] >= len(PROMPT) * 3


async def test_openai_routes_on_the_engine(engine_a: EngineServer) -> None:
    client = openai.AsyncOpenAI(base_url=engine_a.url + "/v1", api_key="none", max_retries=0)
    r = await client.chat.completions.create(
        model="opengyre-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert r.usage is not None and r.usage.completion_tokens == len(engine_a.engine.request_log()[-1].output_ids)
    text = ""
    stream = await client.completions.create(model="opengyre-tiny", prompt="abc", max_tokens=5, stream=True)
    async for ch in stream:
        text += ch.choices[0].text
    rec = engine_a.engine.request_log()[-1]
    assert text == engine_a.engine.codec.decode(rec.output_ids)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])


async def test_api_key_guards_everything_but_health() -> None:
    async with EngineServer(EngineConfig(port=0, api_key="sekret")) as srv, httpx.AsyncClient() as c:
        assert (await c.get(srv.url + "/health")).status_code == 200
        assert (await c.get(srv.url + "/model_info")).status_code == 401
        assert (await c.get(srv.url + "/model_info", headers={"authorization": "Bearer no"})).status_code == 403
        assert (await c.get(srv.url + "/model_info", headers={"authorization": "Bearer sekret"})).status_code == 200


async def test_an_engine_runs_as_a_child_process() -> None:
    """... within the HTTP limits its config names (handed over as the environment it reads them from)."""
    limits = HttpLimits(max_body_bytes=64 * 1024)
    async with EngineProcess(EngineConfig(port=0, threads=1, served_model_name="child", http=limits)) as proc:
        async with httpx.AsyncClient(timeout=60) as c:
            big = await c.post(proc.url + "/generate", content=b"[" * (100 * 1024))
            assert big.status_code == 413 and "larger than 65536 bytes" in big.json()["error"]["message"]
            info = (await c.get(proc.url + "/model_info")).json()
            r = await c.post(
                proc.url + "/generate", json={"input_ids": PROMPT, "rid": "x", "sampling_params": {"max_new_tokens": 3}}
            )
            log = (await c.get(proc.url + "/og/request_log", params={"rid": "x"})).json()
        assert info["served_model_name"] == "child"
        assert log[0]["output_ids"] == r.json()["output_ids"]
        pid = proc.pid
    assert pid is not None and proc.pid is None


async def test_a_cancelled_start_leaves_no_child_process() -> None:
    proc = EngineProcess(EngineConfig(port=0, threads=1))
    task = asyncio.create_task(proc.start())
    try:

        def started() -> bool:
            assert not task.done()
            return proc.pid is not None

        await await_until(started, "the child process started", polls=12000, every=0.01)
        pid = proc.pid
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert proc.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped and reaped, not orphaned in its own session
    finally:
        await proc.stop()


_ENGINE_OWNER = """
import asyncio, sys
from opengyre.engine import EngineConfig, EngineProcess

async def main() -> None:
    proc = await EngineProcess(EngineConfig(port=0, threads=1)).start()
    print("engine-pid", proc.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_an_engine_dies_with_the_process_that_started_it_even_by_sigkill() -> None:
    # A driver killed mid-run must not leave its engines serving (their ports, their memory, the caller's stdout).
    owner = await asyncio.create_subprocess_exec(sys.executable, "-c", _ENGINE_OWNER, stdout=asyncio.subprocess.PIPE)
    try:
        assert owner.stdout is not None
        line = b""
        while not line.startswith(b"engine-pid "):  # the engine shares the owner's stdout: its own lines come too
            line = await owner.stdout.readline()
            assert line, "the owner ended before starting its engine"
        engine_pid = int(line.split()[1])
        assert cmdline(engine_pid) is not None  # serving
    finally:
        owner.kill()
        await owner.wait()
    await await_until(lambda: cmdline(engine_pid) is None, "the engine exited with its owner", polls=1200, every=0.05)


async def test_pause_holds_requests_until_continue(engine_a: EngineServer) -> None:
    async with httpx.AsyncClient(timeout=60) as c:
        assert (await c.post(engine_a.url + "/pause_generation", json={"mode": "in_place"})).status_code == 200
        steps = engine_a.engine.scheduler.steps
        task = asyncio.create_task(
            c.post(engine_a.url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})
        )
        sched = engine_a.engine.scheduler
        await await_until(lambda: sched.load >= 1, "the engine received the request")
        # A control runs on the engine thread once it has taken the request in: paused, it has not stepped.
        await asyncio.wrap_future(sched.call(lambda: None))
        assert not task.done() and sched.steps == steps
        assert (await c.post(engine_a.url + "/continue_generation", json={})).status_code == 200
        r = await task
        assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        assert (await c.post(engine_a.url + "/pause_generation", json={"mode": "sideways"})).status_code == 400


async def test_a_corrupt_checkpoint_is_refused_and_the_engine_keeps_serving(
    engine_a: EngineServer, tmp_path: Path
) -> None:
    save_checkpoint(build_model(model_config("tiny"), seed=7), tmp_path / "ckpt", "step-7")
    data = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 0x40]))  # one bit
    bare = tmp_path / "bare"  # a checkpoint without its digest: nothing to verify it against
    save_checkpoint(build_model(model_config("tiny"), seed=8), bare, "step-8")
    (bare / "opengyre.json").unlink()
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0}, "return_logprob": True}
    async with httpx.AsyncClient(timeout=60) as c:
        before = (await c.post(engine_a.url + "/generate", json=body)).json()
        corrupt = await c.post(engine_a.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "ckpt")})
        unverified = await c.post(engine_a.url + "/update_weights_from_disk", json={"model_path": str(bare)})
        info = (await c.get(engine_a.url + "/model_info")).json()
        after = (await c.post(engine_a.url + "/generate", json=body)).json()
    assert corrupt.status_code == 400 and corrupt.json()["success"] is False
    assert "is corrupt" in corrupt.json()["message"]
    assert unverified.status_code == 400 and "no sha256" in unverified.json()["message"]
    # Nothing was loaded: the same version, the same weights (the same greedy tokens and logprobs).
    assert info["weight_version"] == after["meta_info"]["weight_version"] == "default"
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]


async def test_a_request_whose_sampling_cannot_be_set_up_fails_alone(engine_a: EngineServer) -> None:
    """A seed torch's generator cannot take is refused when parsed (400); one that reaches the scheduler anyway
    (the engine's own API) fails that request with an error instead of leaving it pending, and the engine goes on
    serving the others."""
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(
            engine_a.url + "/generate",
            json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "sampling_seed": 2**64}},
        )
    assert r.status_code == 400 and "sampling_seed" in r.text

    engine = engine_a.engine
    async with contextlib.aclosing(engine.generate(PROMPT, SamplingParams(max_new_tokens=2, seed=2**70))) as bad:
        last = [g async for g in bad][-1]
    assert last.finish is not None and last.finish["type"] == "abort" and last.finish["status_code"] == 400
    assert "sampling could not be set up" in str(last.finish["message"])
    async with contextlib.aclosing(engine.generate(PROMPT, SamplingParams(max_new_tokens=2, seed=7))) as good:
        ok = [g async for g in good][-1]
    assert ok.finish is not None and ok.finish["type"] == "length" and len(ok.output_ids) == 2
