"""A client for SGLang's native API (``/generate`` with ``input_ids``), the way the proxy talks to engines.

The same client talks to the built-in CPU engine and to real SGLang servers; it reads cumulative stream
chunks (SGLang's default) and turns them into token deltas.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from ._http1 import Http1Error, Http1Pool, Http1Response

__all__ = [
    "EngineBadReply",
    "EngineClient",
    "EngineFailed",
    "EngineRejected",
    "EngineReply",
    "behaviour_logprobs",
    "sse_chunks",
]

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


class EngineFailed(Exception):
    """The engine could not be reached or broke off (retry elsewhere)."""


class EngineRejected(Exception):
    """The engine refused the request (a 4xx): retrying elsewhere would not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class EngineBadReply(Exception):
    """The engine answered, but not what the proxy can record (e.g. a token without its behaviour logprob)."""


def _number(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def behaviour_logprobs(raw: object, n_ids: int, offset: int, field_name: str) -> list[float]:
    """The engine's logprob of each of ``n_ids`` new tokens (``offset`` tokens came before them).

    ``raw`` is either SGLang's ``[[logprob, id, text], ...]`` or a plain list of numbers. A token without a
    finite logprob raises EngineBadReply: training on an invented value (0.0 is "probability 1") would be wrong.
    """
    if n_ids == 0 and not raw:
        return []
    if not isinstance(raw, list):
        raise EngineBadReply(
            f"the engine returned {n_ids} output tokens without behaviour logprobs ({field_name} is missing;"
            " the proxy asks for return_logprob)"
        )
    out: list[float] = []
    for i, entry in enumerate(raw):
        v = _number(entry[0] if isinstance(entry, list | tuple) and entry else entry)
        if v is None:
            raise EngineBadReply(
                f"the engine returned no usable behaviour logprob for output token {offset + i} "
                f"({field_name}[{i}] = {str(entry)[:80]})"
            )
        out.append(v)
    if len(out) != n_ids:
        raise EngineBadReply(f"the engine returned {n_ids} output tokens but {len(out)} logprobs ({field_name})")
    return out


@dataclass(slots=True)
class EngineReply:
    """Cumulative output of one ``/generate`` request as the chunks arrive."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    weight_version: str = "default"
    weight_spans: list[tuple[str, int, int]] = field(default_factory=list)  # as the engine reported them
    cached_tokens: int = 0
    prompt_tokens: int = 0


def _error_message(body: bytes) -> str:
    try:
        obj = _dec.decode(body)
    except msgspec.DecodeError:
        return body.decode(errors="replace")[:500]
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("message", obj))
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(obj)


async def sse_chunks(r: Http1Response) -> AsyncGenerator[Any, None]:
    """The JSON chunks of a server-sent-events body; an error chunk raises EngineRejected (4xx) or EngineFailed.

    ``[DONE]`` is skipped and the body read on to its end, so the connection goes back to the pool.
    """
    async for line in r.lines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        chunk = _dec.decode(data)
        if isinstance(chunk, dict) and "error" in chunk:
            err = chunk["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            code = err.get("code") if isinstance(err, dict) else None
            if isinstance(code, int) and 400 <= code < 500:
                raise EngineRejected(code, str(msg))
            raise EngineFailed(f"engine stream error: {msg}")
        yield chunk


class EngineClient:
    # The logprobs it returns are of the raw logits (not at the sampling temperature): see ``_temperature``.
    raw_logprobs = False

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        http: httpx.AsyncClient | None = None,
        idle_timeout_s: float = 4.0,
        read_timeout_s: float = 600.0,
    ) -> None:
        """``idle_timeout_s``: keep-alive connections idle longer are not reused (stay below the engine's own
        keep-alive); ``read_timeout_s``: the longest the engine may stay silent while answering."""
        self.base_url = base_url.rstrip("/")
        self._own = http is None
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0), limits=httpx.Limits(max_connections=1024)
        )
        # The hot path: /generate.
        self.fast = Http1Pool(self.base_url, idle_timeout=idle_timeout_s, read_timeout=read_timeout_s)
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"

    async def close(self) -> None:
        await self.fast.close()
        if self._own:
            await self.http.aclose()

    @staticmethod
    def _apply(reply: EngineReply, chunk: dict[str, Any], incremental: bool) -> tuple[list[int], list[float]]:
        meta = chunk.get("meta_info") or {}
        ids = chunk.get("output_ids")
        lps_raw = meta.get("output_token_logprobs")
        if ids is None and isinstance(lps_raw, list):
            ids = [e[1] for e in lps_raw]
        ids = list(ids or [])
        # Cumulative chunks carry every token so far, deltas only the new ones: checked either way.
        lps = behaviour_logprobs(
            lps_raw, len(ids), 0 if not incremental else len(reply.output_ids), "meta_info.output_token_logprobs"
        )
        if incremental:
            new_ids, new_lps = ids, lps
        else:
            n = len(reply.output_ids)
            new_ids, new_lps = ids[n:], lps[n:]
        reply.output_ids.extend(new_ids)
        reply.output_logprobs.extend(new_lps)
        reply.finish = meta.get("finish_reason")
        reply.weight_version = str(meta.get("weight_version", reply.weight_version))
        spans = meta.get("weight_versions")
        if isinstance(spans, list) and spans:
            reply.weight_spans = [(str(w["version"]), int(w["start"]), int(w["end"])) for w in spans]
        reply.cached_tokens = int(meta.get("cached_tokens") or 0)
        reply.prompt_tokens = int(meta.get("prompt_tokens") or 0)
        return new_ids, new_lps

    async def generate(
        self, payload: dict[str, Any], reply: EngineReply, *, incremental: bool = False
    ) -> AsyncGenerator[tuple[list[int], list[float]], None]:
        """POST /generate and yield ``(new ids, new logprobs)`` deltas, filling ``reply`` as it goes.

        With ``payload["stream"]`` false there is one delta, at the end.
        """
        try:
            r = await self.fast.request("POST", "/generate", _enc.encode(payload), self.headers)
            try:
                if r.status >= 400:
                    self._raise(r.status, await r.read())
                if not payload.get("stream"):
                    yield self._apply(reply, _dec.decode(await r.read()), False)
                    return
                async for chunk in sse_chunks(r):
                    yield self._apply(reply, chunk, incremental)
            finally:
                r.close()  # a no-op once the body was read to the end (the connection is then pooled)
        except (Http1Error, msgspec.DecodeError) as exc:
            raise EngineFailed(f"{type(exc).__name__}: {exc}") from exc
        if reply.finish is None:
            raise EngineFailed("the engine's stream ended without a finish reason")

    @staticmethod
    def _raise(status: int, body: bytes) -> None:
        msg = _error_message(body)
        if 400 <= status < 500 and status not in (408, 429):
            raise EngineRejected(status, msg)
        raise EngineFailed(f"engine answered {status}: {msg}")

    async def abort(self, rid: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.http.post(
                self.base_url + "/abort_request", content=_enc.encode({"rid": rid}), headers=self.headers, timeout=5.0
            )

    async def health(self) -> bool:
        try:
            r = await self.http.get(self.base_url + "/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def incremental_streaming(self) -> bool:
        """Whether the engine streams deltas instead of cumulative chunks (from ``/server_info``; off if unknown)."""
        try:
            r = await self.http.get(self.base_url + "/server_info", headers=self.headers, timeout=5.0)
            info = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(info, dict) and info.get("incremental_streaming_output") is True

    async def model_info(self) -> dict[str, Any]:
        r = await self.http.get(self.base_url + "/model_info", headers=self.headers, timeout=5.0)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out
