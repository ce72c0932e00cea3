"""Load generation against an OpenAI-compatible server: closed-loop sessions (the snowball) or Poisson arrivals.

Each request streams ``/v1/chat/completions``; times come from ``time.monotonic`` (system-wide on Linux, so
worker processes share one clock). A session holds its slot for all its turns and appends the server's real
reply before the next observation. A failed turn ends its session (the snowball cannot go on without the reply)
and marks the run partial; nothing already measured is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import msgspec

from opengyre.http1 import Http1ConnectError, Http1Error, Http1Pool, Http1TimeoutError

from ._workload import SessionPlan

__all__ = ["LoadConfig", "RequestResult", "RunResult", "run_load"]

_GENERATED = ("content", "reasoning_content", "reasoning", "tool_calls")


@dataclass(frozen=True)
class LoadConfig:
    base_url: str  # up to and excluding /v1
    model: str
    concurrency: int = 1  # closed loop: sessions in flight
    rate: float | None = None  # open loop: session arrivals per second (Poisson); concurrency caps in-flight
    workers: int = 1  # processes; each gets a share of the slots and sessions
    api_key: str | None = None
    stall_timeout_s: float = 30.0  # a stream silent this long is a stalled server
    connect_timeout_s: float = 5.0
    ignore_eos: bool = True  # generate each turn's recorded length (vLLM/SGLang's extra parameter)
    record_messages: bool = False  # keep each request's messages (snowball checks, tokenizer cross-check)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    watchdog_interval_s: float = 0.01
    lag_flag_s: float = 0.05  # a loop tick this late means the client itself is the bottleneck


@dataclass
class RequestResult:
    session: str
    turn: int  # 1-based turn index within the session
    scheduled: float  # monotonic: when the request was due (arrival or previous turn's end)
    sent: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2el: float | None = None
    prompt_tokens: int | None = None  # usage
    output_tokens: int | None = None
    max_tokens: int = 0
    chunks: int = 0
    ok: bool = False
    error: str = ""
    reply: str = ""
    messages: list[Mapping[str, Any]] | None = None

    @property
    def queue_s(self) -> float:
        return self.sent - self.scheduled

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2el is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


@dataclass
class RunResult:
    requests: list[RequestResult]
    started: float
    finished: float
    sessions_planned: int
    sessions_completed: int
    loop_lag_max_s: float
    loop_lag_p99_s: float
    client_bottleneck: bool
    errors: list[str]
    # CPU seconds the client's own processes spent while sending (all workers, without their start-up): divided
    # by the requests, what one request costs the load generator, whatever else the machine runs
    client_cpu_s: float = 0.0

    @property
    def partial(self) -> bool:
        return self.sessions_completed < self.sessions_planned or any(not r.ok for r in self.requests)


class _Watchdog:
    """Measures how late the event loop wakes; lateness means the client, not the server, set the pace."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.interval)
            self.lags.append(max(0.0, time.monotonic() - t0 - self.interval))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


_decoder = msgspec.json.Decoder()
_PATH = "/v1/chat/completions"


class _Transport(Protocol):
    """How one worker streams its requests: ``stream(body)`` gives the status and the body's lines (bytes, line
    ends stripped); the connection goes back to the pool once the body has been read to its end."""

    def stream(self, body: bytes) -> AbstractAsyncContextManager[tuple[int, AsyncIterator[bytes]]]: ...

    async def aclose(self) -> None: ...


class _Http1Transport:
    """Plain ``http://``: the lean keep-alive client (one write per request, no per-request pool scan). httpx
    spent ~3 ms of CPU per short streamed request here, most of it in httpcore's pool scanning every
    connection for every request; this client is what keeps the load generator off the critical path."""

    def __init__(self, cfg: LoadConfig, headers: dict[str, str], slots: int) -> None:
        self.headers = headers
        self.pool = Http1Pool(
            cfg.base_url,
            connect_timeout=cfg.connect_timeout_s,
            read_timeout=cfg.stall_timeout_s,
            max_idle=slots,
        )

    @contextlib.asynccontextmanager
    async def stream(self, body: bytes) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        resp = await self.pool.request("POST", _PATH, body, self.headers)
        try:
            yield resp.status, resp.lines()
        finally:
            resp.close()  # a body left unread (an error mid-stream) drops its connection; a finished one is pooled

    async def aclose(self) -> None:
        await self.pool.close()


class _HttpxTransport:
    """``https://`` (which the lean client does not speak): httpx with keep-alive and TCP_NODELAY."""

    def __init__(self, cfg: LoadConfig, headers: dict[str, str], slots: int) -> None:
        timeout = httpx.Timeout(
            connect=cfg.connect_timeout_s, read=cfg.stall_timeout_s, write=cfg.stall_timeout_s, pool=None
        )
        limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
        # TCP_NODELAY: httpx writes a request's head and body separately; with Nagle the body waits for the
        # server's delayed ACK (~40 ms on Linux), which would cap a connection at ~25 requests/s.
        transport = httpx.AsyncHTTPTransport(
            limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        self.client = httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=timeout, transport=transport)

    @contextlib.asynccontextmanager
    async def stream(self, body: bytes) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        async with self.client.stream("POST", _PATH, content=body) as resp:
            yield resp.status_code, _encoded(resp.aiter_lines())

    async def aclose(self) -> None:
        await self.client.aclose()


async def _encoded(lines: AsyncIterator[str]) -> AsyncIterator[bytes]:
    async for line in lines:
        yield line.encode()


_TRANSPORTS: dict[str, Callable[[LoadConfig, dict[str, str], int], _Transport]] = {
    "http": _Http1Transport,
    "https": _HttpxTransport,
}

# What a failure was, by the exception's type (the most specific registered class in its MRO wins).
_FAILURES: dict[type[BaseException], Callable[[LoadConfig, int, BaseException], str]] = {
    Http1ConnectError: lambda cfg, n, e: f"server unreachable at {cfg.base_url}: {e}",
    httpx.ConnectError: lambda cfg, n, e: f"server unreachable at {cfg.base_url}: {e}",
    Http1TimeoutError: lambda cfg, n, e: (
        f"server stalled: no data for {cfg.stall_timeout_s:g} s after {n} chunks ({type(e).__name__})"
    ),
    httpx.TimeoutException: lambda cfg, n, e: (
        f"server stalled: no data for {cfg.stall_timeout_s:g} s after {n} chunks ({type(e).__name__})"
    ),
    Http1Error: lambda cfg, n, e: f"server closed the connection mid-stream after {n} chunks: {e}",
    httpx.RemoteProtocolError: lambda cfg, n, e: f"server closed the connection mid-stream after {n} chunks: {e}",
    httpx.HTTPError: lambda cfg, n, e: f"HTTP failure after {n} chunks: {type(e).__name__}: {e}",
    msgspec.DecodeError: lambda cfg, n, e: f"malformed stream chunk after {n} chunks: {e}",
}


def _failure(cfg: LoadConfig, chunks: int, exc: BaseException) -> str | None:
    for cls in type(exc).__mro__:
        if cls in _FAILURES:
            return _FAILURES[cls](cfg, chunks, exc)
    return None


async def _one(
    client: _Transport, cfg: LoadConfig, messages: list[Mapping[str, Any]], max_tokens: int, rr: RequestResult
) -> None:
    body: dict[str, Any] = {
        "model": cfg.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"ignore_eos": True} if cfg.ignore_eos else {}),
        **cfg.extra_body,
    }
    parts: list[str] = []
    last: float | None = None
    rr.sent = time.monotonic()
    try:
        async with client.stream(msgspec.json.encode(body)) as (status, lines):
            if status != 200:
                text = b"\n".join([line async for line in lines]).decode(errors="replace")[:300]
                rr.error = f"HTTP {status}: {text}"
                return
            done = False
            async for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    # read on to the body's end: a body left unread costs the connection
                    done = True
                    continue
                now = time.monotonic()
                chunk = _decoder.decode(data)
                if "error" in chunk:
                    rr.error = f"server error mid-stream after {rr.chunks} chunks: {chunk['error']}"
                    return
                rr.chunks += 1
                usage = chunk.get("usage")
                if usage:
                    rr.prompt_tokens = usage.get("prompt_tokens")
                    rr.output_tokens = usage.get("completion_tokens")
                for ch in chunk.get("choices") or ():
                    delta = ch.get("delta") or {}
                    # a role-only chunk (or an empty string) is not generated output: TTFT waits for real tokens
                    if any(delta.get(k) for k in _GENERATED):
                        if last is None:
                            rr.ttft = now - rr.sent
                        else:
                            rr.itl.append(now - last)
                        last = now
                        if delta.get("content"):
                            parts.append(delta["content"])
            if not done:
                rr.error = f"stream ended without [DONE] after {rr.chunks} chunks"
                return
            rr.e2el = time.monotonic() - rr.sent
            rr.reply = "".join(parts)
            if rr.ttft is None:
                rr.error = "the stream carried no generated token"
                return
            rr.ok = True
    except Exception as e:
        why = _failure(cfg, rr.chunks, e)
        if why is None:
            raise
        rr.error = why


async def _session(
    client: _Transport, cfg: LoadConfig, plan: SessionPlan, due: float, out: list[RequestResult]
) -> bool:
    messages: list[Mapping[str, Any]] = []
    for k, turn in enumerate(plan.turns, start=1):
        if k > 1 and turn.delay_s > 0:
            # the agent runs its tools (and thinks) holding its slot: the server sees nothing from it meanwhile
            await asyncio.sleep(turn.delay_s)
            due = time.monotonic()
        messages.extend(turn.messages)
        rr = RequestResult(plan.session_id, k, scheduled=due, sent=due, max_tokens=turn.max_tokens)
        if cfg.record_messages:
            rr.messages = list(messages)
        await _one(client, cfg, messages, turn.max_tokens, rr)
        out.append(rr)
        if not rr.ok:
            return False
        messages.append({"role": "assistant", "content": rr.reply})
        due = time.monotonic()
    return True


async def _run_async(cfg: LoadConfig, plans: Sequence[SessionPlan], slots: int, seed: int) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if cfg.api_key:
        headers["authorization"] = f"Bearer {cfg.api_key}"
    out: list[RequestResult] = []
    completed = 0
    dog = _Watchdog(cfg.watchdog_interval_s)
    cpu0 = time.process_time()
    client = _TRANSPORTS[urlsplit(cfg.base_url).scheme](cfg, headers, slots)
    try:
        dog.start()
        started = time.monotonic()
        sem = asyncio.Semaphore(slots)

        async def run(plan: SessionPlan, due: float) -> None:
            nonlocal completed
            async with sem:
                if await _session(client, cfg, plan, due, out):
                    completed += 1

        if cfg.rate is None:
            # closed loop: every slot takes the next session as soon as its previous one ends
            queue = list(plans)
            queue.reverse()

            async def slot() -> None:
                nonlocal completed
                while queue:
                    plan = queue.pop()
                    if await _session(client, cfg, plan, time.monotonic(), out):
                        completed += 1

            await asyncio.gather(*(slot() for _ in range(slots)))
        else:
            rng = random.Random(seed)
            tasks = []
            due = started
            for plan in plans:
                due += rng.expovariate(cfg.rate)
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(run(plan, due)))
            await asyncio.gather(*tasks)
        finished = time.monotonic()
        await dog.stop()
    finally:
        await client.aclose()
    return {
        # the objects themselves (they pickle back from a worker as they are): ``asdict`` deep-copied every
        # field of every request, a quarter of the client's CPU on short requests
        "requests": out,
        "cpu_s": time.process_time() - cpu0,
        "started": started,
        "finished": finished,
        "completed": completed,
        "lags": dog.lags,
    }


def _worker(cfg: LoadConfig, plans: Sequence[SessionPlan], slots: int, seed: int) -> dict[str, Any]:
    return asyncio.run(_run_async(cfg, plans, slots, seed))


def _merge(cfg: LoadConfig, parts: list[dict[str, Any]], planned: int) -> RunResult:
    reqs: list[RequestResult] = [r for p in parts for r in p["requests"]]
    lags = sorted(x for p in parts for x in p["lags"]) or [0.0]
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
    errors = sorted({r.error for r in reqs if r.error})
    return RunResult(
        requests=reqs,
        started=min(p["started"] for p in parts),
        finished=max(p["finished"] for p in parts),
        sessions_planned=planned,
        sessions_completed=sum(p["completed"] for p in parts),
        loop_lag_max_s=lags[-1],
        loop_lag_p99_s=p99,
        client_bottleneck=p99 > cfg.lag_flag_s,
        errors=errors,
        client_cpu_s=sum(p["cpu_s"] for p in parts),
    )


async def run_load(cfg: LoadConfig, plans: Sequence[SessionPlan]) -> RunResult:
    """Send every planned session; with ``workers > 1`` the slots and sessions are split over processes."""
    if cfg.concurrency <= 0:
        raise ValueError(f"concurrency must be positive, got {cfg.concurrency}")
    if cfg.workers <= 0 or cfg.workers > cfg.concurrency:
        raise ValueError(f"workers must be in 1..concurrency ({cfg.concurrency}), got {cfg.workers}")
    if cfg.rate is not None and cfg.rate <= 0:
        raise ValueError(f"rate must be positive, got {cfg.rate}")
    if not plans:
        raise ValueError("no sessions to send")
    if urlsplit(cfg.base_url).scheme not in _TRANSPORTS:
        raise ValueError(f"the server URL must be http:// or https://, got {cfg.base_url!r}")
    if cfg.workers == 1:
        parts = [await _run_async(cfg, plans, cfg.concurrency, cfg.seed)]
    else:
        w = cfg.workers
        shares = [list(plans[i::w]) for i in range(w)]
        slots = [cfg.concurrency // w + (1 if i < cfg.concurrency % w else 0) for i in range(w)]
        # Poisson: each worker draws arrivals at its share of the rate, so the union is Poisson at the full rate
        sub = [LoadConfig(**{**asdict(cfg), "rate": cfg.rate / w if cfg.rate else None}) for _ in range(w)]
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(w, mp_context=multiprocessing.get_context("spawn")) as pool:
            futs = [
                loop.run_in_executor(pool, _worker, sub[i], shares[i], slots[i], cfg.seed + i)
                for i in range(w)
                if shares[i]
            ]
            parts = list(await asyncio.gather(*futs))
    return _merge(cfg, parts, len(plans))
