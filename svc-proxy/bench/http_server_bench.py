"""What the HTTP limits cost the server: CPU per request of uvicorn's httptools protocol as it comes (the baseline,
no limits), the guarded one the gateway and the engines serve with (``opengyre.asgi.HttpServer``), and h11 with
its 16 KiB-style head bound (``h11_max_incomplete_event_size``, the other way to bound a head).

    .venv/bin/python svc-proxy/bench/http_server_bench.py            # 3 rounds
    .venv/bin/python svc-proxy/bench/http_server_bench.py --quick    # 1 round, fewer requests

Each server runs alone in this process on one event loop, a Starlette app answering a small JSON; the load comes
from a child process (keep-alive connections, POSTs of a 1 KiB and of a 1 MiB JSON body), so this process's CPU
time over a run (``time.process_time``) is the server's alone. Rounds alternate the variants so load drift hits all
alike (after one uncounted warm-up run each); the figure is the median over rounds, the ratio is to the
baseline's median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from opengyre.asgi import HttpServer
from opengyre.config import HttpLimits


async def _echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse({"bytes": len(body), "text": "ok"})


APP = Starlette(routes=[Route("/generate", _echo, methods=["POST"])])


class _Plain:
    """uvicorn as it comes, on a given protocol (the same embedding as HttpServer, without its guard)."""

    def __init__(self, **config: object) -> None:
        self._server = uvicorn.Server(
            uvicorn.Config(APP, port=0, log_level="warning", access_log=False, lifespan="off", **config)  # type: ignore[arg-type]
        )
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task


class _Guarded:
    def __init__(self) -> None:
        self._server = HttpServer(APP, limits=HttpLimits())
        self.port = self._server.port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()


VARIANTS: dict[str, Callable[[], _Plain | _Guarded]] = {
    "httptools, no limits (baseline)": lambda: _Plain(http="httptools"),
    "httptools + HttpLimits (served)": _Guarded,
    "h11, 32 KiB head bound": lambda: _Plain(http="h11", h11_max_incomplete_event_size=32 * 1024),
}


async def _one_run(make: Callable[[], _Plain | _Guarded], n: int, conc: int, body: int) -> float:
    """Server CPU-seconds per request over ``n`` requests from ``conc`` connections."""
    srv = make()
    await srv.start()
    try:
        cmd = [sys.executable, __file__, "--load", str(srv.port), str(n), str(conc), str(body)]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        await proc.stdout.readline()  # "ready": connected; the timed part starts now
        cpu0 = time.process_time()
        out = await proc.stdout.readline()
        cpu = time.process_time() - cpu0
        await proc.wait()
        assert int(out) == n, out
        return cpu / n
    finally:
        await srv.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds = 1 if args.quick else 3
    cases = [("1 KiB", 1024, 2000 if args.quick else 6000), ("1 MiB", 1 << 20, 100 if args.quick else 300)]
    print("| body | variant | server CPU µs per request | ratio to baseline |")
    print("| --- | --- | --- | --- |")
    for label, body, n in cases:
        per: dict[str, list[float]] = {k: [] for k in VARIANTS}
        for make in VARIANTS.values():  # warm-up (imports, first-use caches), not counted
            await _one_run(make, max(20, n // 20), 16, body)
        for _ in range(rounds):
            for name, make in VARIANTS.items():
                per[name].append(await _one_run(make, n, 16, body))
        base = statistics.median(per[next(iter(VARIANTS))])
        for name, xs in per.items():
            m = statistics.median(xs)
            print(f"| {label} | {name} | {m * 1e6:.1f} | {m / base:.3f} |", flush=True)


# --- the load (a child process) ---------------------------------------------------------------------------------


async def _load(port: int, n: int, conc: int, size: int) -> None:
    payload = b'{"text": "' + b"x" * max(0, size - 12) + b'"}'
    request = (
        b"POST /generate HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(payload)
    ) + payload
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(conc)]
    print("ready", flush=True)
    left = [n]

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        done = 0
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            assert head.startswith(b"HTTP/1.1 200"), head
            done += 1
        writer.close()
        return done

    tasks: list[Awaitable[int]] = [worker(r, w) for r, w in conns]
    print(sum(await asyncio.gather(*tasks)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        asyncio.run(_load(*(int(a) for a in sys.argv[2:6])))  # type: ignore[arg-type]
    else:
        asyncio.run(main())
