"""Start and stop CPU engines: in this process (tests, the demo) or as a child process (one per cell)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from opengyre.asgi import HttpServer
from opengyre.config import HttpLimits
from opengyre.runtime import ExitedBeforeReady, spawn, wait_ready

from ._engine import CpuEngine, EngineConfig
from ._server import build_app

__all__ = ["EngineProcess", "EngineServer", "serve_forever"]


class EngineServer:
    """An engine serving HTTP on this event loop; the model runs on the engine's own worker thread.

    ``async with EngineServer(EngineConfig(port=0)) as srv: srv.url`` -> ``http://127.0.0.1:<port>``.
    """

    def __init__(self, config: EngineConfig | None = None, *, engine: CpuEngine | None = None) -> None:
        self.config = config or (engine.config if engine else EngineConfig())
        self.engine = engine or CpuEngine(self.config)
        self._http: HttpServer | None = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the engine is not started")
        return self._http.url

    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("the engine is not started")
        return self._http.port

    async def start(self) -> EngineServer:
        self.engine.start()
        limits = self.config.http or HttpLimits.from_env(os.environ)
        self._http = HttpServer(build_app(self.engine), self.config.host, self.config.port, limits=limits)
        await self._http.start()
        return self

    async def stop(self) -> None:
        if self._http is not None:
            # Finish in-flight requests with an abort first, so their streams end cleanly.
            self.engine.abort("", abort_all=True)
            await self._http.stop()
            self._http = None
        await asyncio.to_thread(self.engine.stop)

    async def __aenter__(self) -> EngineServer:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def _cli_args(config: EngineConfig, port_file: Path) -> list[str]:
    args = [
        sys.executable,
        "-m",
        "opengyre.engine",
        "--preset",
        config.preset,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--seed",
        str(config.seed),
        "--weight-version",
        config.weight_version,
        "--max-running",
        str(config.max_running),
        "--prefill-chunk",
        str(config.prefill_chunk),
        "--port-file",
        str(port_file),
    ]
    if config.checkpoint is not None:
        args += ["--checkpoint", str(config.checkpoint)]
    if config.model_cache is not None:
        args += ["--model-cache", str(config.model_cache)]
    if config.served_model_name:
        args += ["--served-model-name", config.served_model_name]
    if config.api_key:
        args += ["--api-key", config.api_key]
    if config.context_length:
        args += ["--context-length", str(config.context_length)]
    if config.threads:
        args += ["--threads", str(config.threads)]
    if config.incremental_streaming_output:
        args += ["--incremental-streaming-output"]
    return args


class EngineProcess:
    """An engine in a child process, e.g. one per rollout cell; ``url`` once ``start`` returns."""

    def __init__(self, config: EngineConfig | None = None, *, env: dict[str, str] | None = None) -> None:
        self.config = config or EngineConfig()
        self.env = env
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="opengyre-engine-")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self, timeout: float = 120.0) -> EngineProcess:
        port_file = Path(self._dir.name) / "url"
        # Started from this (the event loop's) thread, not a worker's: the kernel's parent-death signal follows the
        # thread that forked, and an engine must die with its driver however that ends (SIGTERM, SIGKILL), or it
        # keeps its port, its memory and the caller's stdout (opengyre.runtime.spawn).
        # The HTTP limits travel as the environment they are read from (none set: the parent's environment's).
        limits = self.config.http.to_env() if self.config.http else {}
        self._proc = spawn(_cli_args(self.config, port_file), env={**os.environ, **limits, **(self.env or {})})
        deadline = time.monotonic() + timeout
        try:
            try:
                self.url = await wait_ready(port_file, proc=self._proc, timeout=timeout)
            except ExitedBeforeReady as exc:
                raise RuntimeError(f"the engine process exited with {exc.returncode} before serving") from None
            except TimeoutError:
                raise TimeoutError(f"the engine process did not start within {timeout}s") from None
            async with httpx.AsyncClient(timeout=5) as c:
                while (await c.get(self.url + "/health")).status_code != 200:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the engine process did not answer /health within {timeout}s")
                    await asyncio.sleep(0.05)
        except BaseException:
            await self.stop()  # a failed or cancelled start leaves no child behind (it runs in its own session)
            raise
        return self

    async def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        self._dir.cleanup()

    def kill(self) -> None:
        """Kill without warning (what a crashed cell looks like)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    async def __aenter__(self) -> EngineProcess:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def serve_forever(config: EngineConfig, port_file: Path | None = None) -> None:
    """Serve until SIGINT/SIGTERM; write the URL to ``port_file`` once serving (how a parent finds it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with EngineServer(config) as srv:
        if port_file is not None:
            await asyncio.to_thread(_write_atomic, port_file, srv.url + "\n")
        print(
            f"opengyre engine ({config.model_name}, weights {srv.engine.weight_version}) serving on {srv.url}",
            flush=True,
        )
        await stop.wait()


def _write_atomic(path: Path, text: str) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
