"""Serve a Starlette app with uvicorn inside the running event loop (engines and the gateway both do), within
``HttpLimits`` (header size and count, body size, head and body timeouts, keep-alive, connections: ``_http_guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from opengyre.config import HttpLimits

from ._http_guard import ConnectionGuard, Render, guarded_protocol, plain_render

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The host process (a service, a test, the CLI) owns signal handling, not this embedded server.
        yield


class HttpServer:
    """Bind first (so port 0 resolves before serving), then serve until ``stop``. ``render``: the JSON body of a
    refusal the server itself answers (431, 413, 408, 503), in the app's error shape."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        limits: HttpLimits | None = None,
        render: Render = plain_render,
    ) -> None:
        self.app = app
        self.limits = limits or HttpLimits()
        self._guard = ConnectionGuard(self.limits, render)
        self.host = host
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without
        # it uvicorn's separate header and body writes meet delayed ACKs (40 ms per response).
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        # Listen now: with SO_REUSEADDR, Linux lets two sockets bind one port while neither listens, and the
        # second's listen (in serve) then failed with EADDRINUSE past the caller's fallback to a free port (two
        # stacks started at once: tests/libs/runtime/test_supervisor_ports.py). uvicorn's listen again only sets
        # the backlog.
        self._sock.listen(2048)
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=guarded_protocol(self._guard),
            timeout_keep_alive=self.limits.keep_alive_s,  # type: ignore[arg-type]  # seconds as a float work too
            timeout_graceful_shutdown=3,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def refused(self) -> Counter[str]:
        """Requests and connections the server refused itself, by reason (``Refusal.reason``)."""
        return self._guard.refused

    @property
    def connections(self) -> int:
        """Connections open now (refused ones not counted)."""
        return self._guard.open

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name=f"http-{self.port}")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise RuntimeError("HTTP server exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._guard.close_lingering()  # refused connections: uvicorn would wait for them to close
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._task = None
        with contextlib.suppress(OSError):
            self._sock.close()
