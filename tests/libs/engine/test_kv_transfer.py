"""A sequence's KV moves between two real CPU engines over their API: the continuation on the second equals the
first's (greedy, logprobs to float tolerance) and the second computes none of the moved positions."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import torch

from opengyre.engine import KV_FORMAT, KV_MEDIA_TYPE, EngineConfig, EngineServer, KVExport

from ..._polling import await_until

PROMPT = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97, 115, 115, 10] * 3  # 45 tokens
GREEDY = {"temperature": 0, "ignore_eos": True}


async def _generate(c: httpx.AsyncClient, url: str, ids: list[int], n: int, **extra: Any) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": n}, "return_logprob": True, **extra}
    r = await c.post(url + "/generate", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _lps(out: dict[str, Any]) -> torch.Tensor:
    return torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def _state(srv: EngineServer) -> tuple[int, int]:
    s = srv.engine.scheduler
    return s.prefill_tokens, s.prefix_cache.hit_tokens


async def _move(c: httpx.AsyncClient, src: str, dst: str, body: dict[str, Any]) -> tuple[KVExport, dict[str, Any]]:
    r = await c.post(src + "/og/kv/export", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == KV_MEDIA_TYPE
    kv = KVExport.decode(r.content)
    got = await c.post(dst + "/og/kv/import", content=r.content, headers={"content-type": KV_MEDIA_TYPE})
    assert got.status_code == 200, got.text
    reply: dict[str, Any] = got.json()
    return kv, reply


def _pause_after_admitted(srv: EngineServer, steps: int) -> None:
    """Pause the engine from its own thread ``steps`` steps after it first holds a request."""
    sched = srv.engine.scheduler
    start: list[int] = []

    def check() -> None:
        if not start and sched.load >= 1:
            start.append(sched.steps)
        if start and sched.steps >= start[0] + steps:
            sched.set_paused(True)
        else:
            sched.call(check)

    sched.call(check)


async def test_a_cached_sequence_continues_on_another_engine_without_its_prefill() -> None:
    async with (
        EngineServer(EngineConfig(port=0)) as a,
        EngineServer(EngineConfig(port=0)) as b,
        httpx.AsyncClient(timeout=120) as c,
    ):
        whole = await _generate(c, a.url, PROMPT, 24)  # what A produces uninterrupted
        await c.post(a.url + "/flush_cache")
        first = await _generate(c, a.url, PROMPT, 8)  # A stops after 8 tokens; its KV stays in its prefix cache
        assert first["output_ids"] == whole["output_ids"][:8]
        seq = PROMPT + first["output_ids"]
        kv, reply = await _move(c, a.url, b.url, {"input_ids": seq})
        n = len(seq) - 1  # A's cache holds every position but the last sampled token's, which it never ran
        assert reply == {"success": True, "tokens": n, "pending_ids": []}
        assert kv.token_ids == seq[:n] and kv.meta["format"] == KV_FORMAT and kv.meta["weight_version"] == "default"
        assert tuple(kv.keys.shape) == (2, 2, n, 16) and kv.keys.dtype == torch.float32
        prefill0, hits0 = _state(b)
        rest = await _generate(c, b.url, seq, 16)
        prefill1, hits1 = _state(b)
    assert rest["output_ids"] == whole["output_ids"][8:]
    assert torch.allclose(_lps(rest), _lps(whole)[8:], atol=1e-4)
    # B computed one position (the token A sampled last) and reused the n it was given.
    assert rest["meta_info"]["cached_tokens"] == n
    assert (prefill1 - prefill0, hits1 - hits0) == (1, n)
    assert b.engine.scheduler.kv_imported_tokens == n


async def test_a_running_sequence_moves_with_its_pending_token() -> None:
    async with (
        EngineServer(EngineConfig(port=0)) as a,
        EngineServer(EngineConfig(port=0)) as b,
        httpx.AsyncClient(timeout=120) as c,
    ):
        whole = await _generate(c, a.url, PROMPT, 64)
        await c.post(a.url + "/flush_cache")
        sched = a.engine.scheduler
        # Counted from the engine's own thread once it holds the request: polled from here, a loaded machine let A
        # run 53 steps before the pause was even set (a CI failure).
        _pause_after_admitted(a, 6)
        running = asyncio.create_task(_generate(c, a.url, PROMPT, 4000, rid="moving"))
        await await_until(lambda: sched.paused, "A paused after six more steps", polls=12000, every=0.01)
        kv, reply = await _move(c, a.url, b.url, {"rid": "moving"})
        await c.post(a.url + "/abort_request", json={"rid": "moving"})
        assert (await c.post(a.url + "/continue_generation", json={})).status_code == 200
        stopped = await running
        done = len(kv.token_ids) + len(kv.pending_ids) - len(PROMPT)  # tokens A had produced when it was paused
        assert 0 < done < 64 - 8
        assert kv.token_ids[: len(PROMPT)] == PROMPT and len(kv.pending_ids) == 1
        assert reply["tokens"] == len(kv.token_ids) and reply["pending_ids"] == kv.pending_ids
        assert stopped["output_ids"][:done] == whole["output_ids"][:done]
        prefill0, _ = _state(b)
        rest = await _generate(c, b.url, kv.token_ids + kv.pending_ids, 8)
        prefill1, _ = _state(b)
    assert kv.token_ids + kv.pending_ids == PROMPT + whole["output_ids"][:done]
    assert rest["output_ids"] == whole["output_ids"][done : done + 8]
    assert torch.allclose(_lps(rest), _lps(whole)[done : done + 8], atol=1e-4)
    assert rest["meta_info"]["cached_tokens"] == len(kv.token_ids) and prefill1 - prefill0 == 1


async def test_kv_of_other_weights_or_versions_is_refused_and_bad_requests_get_clear_errors() -> None:
    async with (
        EngineServer(EngineConfig(port=0)) as a,
        EngineServer(EngineConfig(port=0, seed=1)) as other_weights,
        EngineServer(EngineConfig(port=0, weight_version="step-2")) as other_version,
        httpx.AsyncClient(timeout=120) as c,
    ):
        out = await _generate(c, a.url, PROMPT, 4)
        r = await c.post(a.url + "/og/kv/export", json={"input_ids": PROMPT + out["output_ids"]})
        assert r.status_code == 200
        blob = r.content
        ct = {"content-type": KV_MEDIA_TYPE}
        w = await c.post(other_weights.url + "/og/kv/import", content=blob, headers=ct)
        v = await c.post(other_version.url + "/og/kv/import", content=blob, headers=ct)
        assert w.status_code == 409 and "weights_sha256" in w.json()["error"]["message"]
        assert "weight_version" not in w.json()["error"]["message"]
        assert (
            v.status_code == 409
            and "weight_version: 'default' in the export, 'step-2' here" in (v.json()["error"]["message"])
        )
        assert other_weights.engine.scheduler.prefix_cache.tokens == 0 == other_version.engine.scheduler.kv_imports
        # A tampered header: the identity is unreadable, nothing is imported.
        size = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8 : 8 + size])
        header["__metadata__"]["layers"] = "3"
        raw = json.dumps(header, separators=(",", ":")).encode()
        assert len(raw) <= size
        raw += b" " * (size - len(raw))
        tampered = blob[:8] + raw + blob[8 + size :]
        t = await c.post(a.url + "/og/kv/import", content=tampered, headers=ct)
        assert t.status_code == 409 and "layers: '3' in the export, '2' here" in t.json()["error"]["message"]
        bad = {
            "garbage": await c.post(a.url + "/og/kv/import", content=b"not a kv export", headers=ct),
            "truncated": await c.post(a.url + "/og/kv/import", content=blob[: len(blob) // 2], headers=ct),
            "json body": await c.post(a.url + "/og/kv/import", json={"input_ids": PROMPT}),
            "unknown rid": await c.post(a.url + "/og/kv/export", json={"rid": "nobody"}),
            "uncached": await c.post(a.url + "/og/kv/export", json={"input_ids": list(range(40))}),
            "both": await c.post(a.url + "/og/kv/export", json={"rid": "x", "input_ids": PROMPT}),
            "extra": await c.post(a.url + "/og/kv/export", json={"input_ids": PROMPT, "layer": 1}),
            "bad ids": await c.post(a.url + "/og/kv/export", json={"input_ids": ["a"]}),
            "null rid": await c.post(a.url + "/og/kv/export", json={"rid": None}),
        }
        codes = {k: r.status_code for k, r in bad.items()}
        assert codes == {
            "garbage": 400,
            "truncated": 400,
            "json body": 415,
            "unknown rid": 404,
            "uncached": 404,
            "both": 400,
            "extra": 400,
            "bad ids": 400,
            "null rid": 400,
        }
        assert all(r.json()["error"]["message"] for r in bad.values())
        assert a.engine.scheduler.kv_imports == 0
