"""vLLM's OpenAI server as an alternative backend: token ids in through ``/v1/completions``, token ids out.

The dispatcher speaks SGLang's request shape; this client translates it to vLLM's completions request with
``prompt`` as token ids and ``return_token_ids`` (vLLM >= 0.10-ish; PROTOCOLS §2), streams, and maps the
answer back (delta ``token_ids`` and ``logprobs.token_logprobs`` per chunk, ``finish_reason`` strings). vLLM
aborts a request when its client goes away, so aborting here closes that request's stream; the tokens
already streamed are exactly what the engine produced for it. Engines are marked by the URL scheme
``vllm+http://``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from opengyre.http1 import Http1Error, Http1Pool

from ._client import EngineConnection, EngineFailed, EngineReply, EngineResponse, behaviour_logprobs, sse_chunks

__all__ = ["VLLM_SCHEME", "VllmClient"]

VLLM_SCHEME = "vllm+"

_enc = msgspec.json.Encoder()

# SGLang sampling_params -> vLLM completions fields (the same meaning under another name, or the same name).
_RENAME = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
}
_SAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "logit_bias",
)


def to_vllm(payload: dict[str, Any], model: str) -> dict[str, Any]:
    sp = payload.get("sampling_params") or {}
    body: dict[str, Any] = {
        "model": model,
        "prompt": payload["input_ids"],
        "return_token_ids": True,
        "logprobs": 0,  # the sampled token's logprob (no alternatives)
        "stream": True,
        "request_id": payload.get("rid"),
    }
    k = payload.get("top_logprobs_num")
    if k:
        # Alternatives keyed "token_id:N", not by text (text does not name a token uniquely).
        body["logprobs"] = k
        body["return_tokens_as_token_ids"] = True
    for k, v in sp.items():
        if k in _RENAME:
            body[_RENAME[k]] = v
        elif k in _SAME:
            body[k] = {str(t): b for t, b in v.items()} if k == "logit_bias" else v
    return body


def _alternatives(entry: object) -> list[tuple[int, float]]:
    """vLLM's ``{"token_id:N": logprob}`` for one token as ``(id, logprob)`` pairs, most likely first."""
    out = []
    for key, lp in entry.items() if isinstance(entry, dict) else ():
        if isinstance(key, str) and key.startswith("token_id:") and isinstance(lp, int | float):
            out.append((int(key[9:]), float(lp)))
    return sorted(out, key=lambda p: -p[1])


def _finish(choice: dict[str, Any], n: int) -> dict[str, Any] | None:
    reason = choice.get("finish_reason")
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": n}
    if reason == "stop":
        return {"type": "stop", "matched": choice.get("stop_reason")}
    return {"type": "abort", "message": str(reason), "status_code": 500 if reason == "error" else None}


class VllmClient:
    """vLLM's ``/v1/completions`` with token ids, behind the same ``RolloutEngine`` protocol as SGLang's client."""

    raw_logprobs = True  # vLLM's default --logprobs-mode raw_logprobs

    def __init__(self, conn: EngineConnection) -> None:
        """``conn``: to the server's own ``http://`` URL (the pool strips the ``vllm+`` it routes by)."""
        self.conn = conn
        self.model: str | None = None
        self._streams: dict[str, EngineResponse] = {}
        self._aborted: set[str] = set()

    @property
    def fast(self) -> Http1Pool:
        return self.conn.fast

    async def close(self) -> None:
        await self.conn.close()

    async def health(self) -> bool:
        return await self.conn.healthy()

    async def _model(self) -> str:
        if self.model is None:
            models = await self.conn.get_json("/v1/models")
            if not isinstance(models, dict):
                raise EngineFailed("the engine did not list its model (GET /v1/models)")
            data = models.get("data") or [{}]
            self.model = str(data[0].get("id", "default"))
        return self.model

    async def incremental_streaming(self) -> bool:
        return True  # vLLM streams deltas

    async def context_length(self) -> int | None:
        """vLLM lists ``max_model_len`` with its model in ``/v1/models``."""
        models = await self.conn.get_json("/v1/models")
        data = (models.get("data") if isinstance(models, dict) else None) or [{}]
        value = data[0].get("max_model_len") if isinstance(data[0], dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    async def generate(
        self, payload: dict[str, Any], reply: EngineReply, *, incremental: bool = True
    ) -> AsyncGenerator[tuple[list[int], list[float]], None]:
        rid = str(payload.get("rid", ""))
        r = await self.conn.post("/v1/completions", to_vllm(payload, await self._model()))
        self._streams[rid] = r
        try:
            if r.status >= 400:
                self.conn.raise_for(r.status, await r.read())
            async for chunk in sse_chunks(r):
                for choice in chunk.get("choices") or []:
                    ids = list(choice.get("token_ids") or [])
                    lp = (choice.get("logprobs") or {}).get("token_logprobs")
                    lps = behaviour_logprobs(lp, len(ids), len(reply.output_ids), "logprobs.token_logprobs")
                    reply.output_ids.extend(ids)
                    reply.output_logprobs.extend(lps)
                    tops = (choice.get("logprobs") or {}).get("top_logprobs")
                    if isinstance(tops, list):
                        reply.output_top.extend(_alternatives(t) for t in tops)
                    reply.finish = _finish(choice, len(reply.output_ids)) or reply.finish
                    if ids:
                        yield ids, lps
        except (Http1Error, msgspec.DecodeError) as exc:
            if rid not in self._aborted:
                raise EngineFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._streams.pop(rid, None)
            r.close()
        if rid in self._aborted:
            self._aborted.discard(rid)
            if reply.finish is None:
                reply.finish = {"type": "abort", "message": "Aborted", "status_code": None}
        if reply.finish is None:
            raise EngineFailed("the engine's stream ended without a finish reason")

    async def abort(self, rid: str) -> None:
        """vLLM aborts a request whose client goes away: close the stream (the tokens seen are the output)."""
        r = self._streams.get(rid)
        if r is not None:
            self._aborted.add(rid)
            r.close()
            await asyncio.sleep(0)
