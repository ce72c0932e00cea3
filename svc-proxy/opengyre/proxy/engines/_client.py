"""A client for SGLang's native API (``/generate`` with ``input_ids``), the way the proxy talks to engines.

The same client talks to the built-in CPU engine and to real SGLang servers; it reads cumulative stream
chunks (SGLang's default) and turns them into token deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec

from opengyre.http1 import Http1Error, Http1Pool
from opengyre.trajectory import is_logprob
from opengyre.wire import finite_number, top_alternatives

__all__ = [
    "EngineBadReply",
    "EngineClient",
    "EngineConnection",
    "EngineFailed",
    "EngineOptions",
    "EngineRejected",
    "EngineReply",
    "EngineResponse",
    "RolloutEngine",
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


def behaviour_logprobs(raw: object, n_ids: int, offset: int, field_name: str) -> list[float]:
    """The engine's logprob of each of ``n_ids`` new tokens (``offset`` tokens came before them).

    ``raw`` is either SGLang's ``[[logprob, id, text], ...]`` or a plain list of numbers. A token without a
    finite logprob raises EngineBadReply: training on an invented value (0.0 is "probability 1") would be wrong.
    So does a value that is no log probability (above 0 by more than float noise, ``is_logprob``'s 1e-6, the
    bound the trainer checks too): recorded, it would only be refused later, with the trainer's whole batch.
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
        v = finite_number(entry[0] if isinstance(entry, list | tuple) and entry else entry)
        if v is None:
            raise EngineBadReply(
                f"the engine returned no usable behaviour logprob for output token {offset + i} "
                f"({field_name}[{i}] = {str(entry)[:80]})"
            )
        if not is_logprob(v):
            raise EngineBadReply(
                f"the engine returned behaviour logprob {v!r} for output token {offset + i} ({field_name}[{i}]): "
                "a log probability is at most 0"
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
    output_top: list[list[tuple[int, float]]] = field(default_factory=list)  # alternatives, when asked for
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


async def sse_chunks(r: EngineResponse) -> AsyncGenerator[Any, None]:
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


class RolloutEngine(Protocol):
    """What the dispatcher and the pool need of an engine client; SGLang's and vLLM's clients implement it."""

    raw_logprobs: bool  # its logprobs are of the raw logits, not at the sampling temperature (``_temperature``)
    conn: EngineConnection

    def generate(
        self, payload: dict[str, Any], reply: EngineReply, *, incremental: bool = False
    ) -> AsyncGenerator[tuple[list[int], list[float]], None]:
        """Run SGLang's ``/generate`` payload; yield ``(new ids, new logprobs)``, filling ``reply``."""
        ...

    async def abort(self, rid: str) -> None: ...

    async def health(self) -> bool: ...

    async def incremental_streaming(self) -> bool: ...

    async def context_length(self) -> int | None:
        """The longest prompt + output the engine serves, as it reports it (None if it does not)."""
        ...

    async def close(self) -> None: ...


class EngineResponse(Protocol):
    """A hot-path response being read: what the HTTP/1 client and the httpx adapter both give."""

    status: int

    async def read(self) -> bytes: ...

    def lines(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...


_closing: set[asyncio.Task[None]] = set()


class _HttpxResponse:
    """An httpx streamed response behind ``EngineResponse`` (the benchmark's baseline transport)."""

    def __init__(self, r: httpx.Response) -> None:
        self._r = r
        self.status = r.status_code

    async def read(self) -> bytes:
        try:
            return await self._r.aread()
        except httpx.HTTPError as exc:
            raise Http1Error(f"{type(exc).__name__}: {exc}") from exc

    async def lines(self) -> AsyncIterator[bytes]:
        try:
            async for line in self._r.aiter_lines():
                yield line.encode()
        except httpx.HTTPError as exc:
            raise Http1Error(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        task = asyncio.get_running_loop().create_task(self._r.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


@dataclass(frozen=True)
class EngineOptions:
    """How the proxy talks to every engine, whatever its kind.

    ``idle_timeout_s``: keep-alive connections idle longer are not reused (stay below the engine's own keep-alive);
    ``read_timeout_s``: the longest the engine may stay silent while answering; ``transport="httpx"`` sends the hot
    path through httpx instead of the hand-written HTTP/1 pool, with the same read timeout: the baseline
    svc-proxy/bench/proxy_bench.py measures the hand-written client against (docs/benchmarks.md).
    """

    api_key: str | None = None
    idle_timeout_s: float = 4.0
    read_timeout_s: float = 600.0
    transport: str = "http1"

    def __post_init__(self) -> None:
        if self.transport not in ("http1", "httpx"):
            raise ValueError(f"unknown engine transport {self.transport!r} (http1 or httpx)")


class EngineConnection:
    """One engine's HTTP plumbing, shared by every client kind (they take one): the hand-written HTTP/1 pool for
    the hot path (with a read timeout), an httpx client for everything else (``http``: shared with other
    engines' connections; None: one of its own), the auth header, and error mapping."""

    def __init__(
        self, base_url: str, options: EngineOptions | None = None, *, http: httpx.AsyncClient | None = None
    ) -> None:
        opts = options or EngineOptions()
        self.base_url = base_url.rstrip("/")
        self.transport = opts.transport
        self._own = http is None
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0), limits=httpx.Limits(max_connections=1024)
        )
        self.fast = Http1Pool(self.base_url, idle_timeout=opts.idle_timeout_s, read_timeout=opts.read_timeout_s)
        self._read_timeout = httpx.Timeout(opts.read_timeout_s, connect=5.0)
        self.headers = {"content-type": "application/json"}
        if opts.api_key:
            self.headers["authorization"] = f"Bearer {opts.api_key}"

    async def close(self) -> None:
        await self.fast.close()
        if self._own:
            await self.http.aclose()

    async def post(self, path: str, payload: dict[str, Any]) -> EngineResponse:
        """POST on the hot path; an engine that cannot be reached raises EngineFailed."""
        try:
            if self.transport == "httpx":
                req = self.http.build_request(
                    "POST", self.base_url + path, content=_enc.encode(payload), headers=self.headers,
                    timeout=self._read_timeout,
                )  # fmt: skip
                return _HttpxResponse(await self.http.send(req, stream=True))
            return await self.fast.request("POST", path, _enc.encode(payload), self.headers)
        except httpx.HTTPError as exc:
            raise EngineFailed(f"{type(exc).__name__}: {exc}") from exc
        except Http1Error as exc:
            raise EngineFailed(f"{type(exc).__name__}: {exc}") from exc

    async def get_json(self, path: str) -> Any:
        """GET a JSON document (admin paths); None if the engine cannot answer it."""
        try:
            r = await self.http.get(self.base_url + path, headers=self.headers, timeout=5.0)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def healthy(self) -> bool:
        try:
            r = await self.http.get(self.base_url + "/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    @staticmethod
    def raise_for(status: int, body: bytes) -> None:
        msg = _error_message(body)
        if 400 <= status < 500 and status not in (408, 429):
            raise EngineRejected(status, msg)
        raise EngineFailed(f"engine answered {status}: {msg}")


class EngineClient:
    """SGLang's native ``/generate`` (and the CPU engine, which serves the same API)."""

    raw_logprobs = False

    def __init__(self, conn: EngineConnection) -> None:
        self.conn = conn

    @property
    def fast(self) -> Http1Pool:
        return self.conn.fast

    async def close(self) -> None:
        await self.conn.close()

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
        tops = meta.get("output_top_logprobs")
        if isinstance(tops, list):
            new_tops = tops if incremental else tops[len(reply.output_top) :]
            reply.output_top.extend(top_alternatives(t) for t in new_tops)
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
        r = await self.conn.post("/generate", payload)
        try:
            if r.status >= 400:
                self.conn.raise_for(r.status, await r.read())
            if not payload.get("stream"):
                yield self._apply(reply, _dec.decode(await r.read()), False)
                return
            async for chunk in sse_chunks(r):
                yield self._apply(reply, chunk, incremental)
        except (Http1Error, msgspec.DecodeError) as exc:
            raise EngineFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            r.close()  # a no-op once the body was read to the end (the connection is then pooled)
        if reply.finish is None:
            raise EngineFailed("the engine's stream ended without a finish reason")

    async def abort(self, rid: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.conn.http.post(
                self.conn.base_url + "/abort_request",
                content=_enc.encode({"rid": rid}),
                headers=self.conn.headers,
                timeout=5.0,
            )

    async def health(self) -> bool:
        return await self.conn.healthy()

    async def incremental_streaming(self) -> bool:
        """Whether the engine streams deltas instead of cumulative chunks (from ``/server_info``; off if unknown)."""
        info = await self.conn.get_json("/server_info")
        return isinstance(info, dict) and info.get("incremental_streaming_output") is True

    async def context_length(self) -> int | None:
        """SGLang reports ``context_length`` in ``/server_info`` (its server args) and ``/model_info``."""
        for path in ("/model_info", "/server_info"):
            info = await self.conn.get_json(path)
            value = info.get("context_length") if isinstance(info, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    async def model_info(self) -> dict[str, Any]:
        r = await self.conn.http.get(self.conn.base_url + "/model_info", headers=self.conn.headers, timeout=5.0)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out
