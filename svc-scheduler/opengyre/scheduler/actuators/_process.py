"""Child processes an actuator owns: start one from an argv template, learn its URL from a file it writes once
ready, stop it with SIGTERM (then SIGKILL); at most one of a kind per cell."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from opengyre.runtime import ExitedBeforeReady, wait_ready

from ._base import ActuatorError

__all__ = ["ChildProcess", "ChildProcesses"]


class ChildProcess:
    def __init__(self, name: str, argv: Sequence[str], *, ready_file: Path, log_file: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready_file = ready_file
        self.log_file = log_file
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, *, timeout: float, env: Mapping[str, str] | None = None) -> str:
        """Start and wait until the ready file appears; its first line (a URL, or "ready") is returned."""
        self.ready_file.unlink(missing_ok=True)
        with self.log_file.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **(env or {})},
                start_new_session=True,
            )  # fmt: skip
        try:
            try:
                # Existence is the signal: a launcher template may only touch the file.
                text = await wait_ready(self.ready_file, proc=self.proc, timeout=timeout, require_text=False)
            except ExitedBeforeReady as exc:
                raise ActuatorError(f"{self.name} exited with {exc.returncode}; see {self.log_file}") from None
            except TimeoutError:
                raise ActuatorError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_file}") from None
        except BaseException:
            # Not ready, or the caller gave up (cancelled): never leave a child running that nobody tracks.
            await self.stop()
            raise
        return (text.splitlines() or ["ready"])[0]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def stop(self, grace: float = 10.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self.ready_file.unlink(missing_ok=True)
        return proc.returncode


class ChildProcesses(dict[str, ChildProcess]):
    """An actuator's processes of one kind (engine, trainer), at most one per cell: cell id -> process."""

    def __init__(self, kind: str, workdir: Path, env: Mapping[str, str]) -> None:
        super().__init__()
        self.kind = kind
        self.workdir = workdir
        self.env = env

    async def start(self, cell_id: str, argv: Sequence[str], fields: Mapping[str, str], *, timeout: float) -> str:
        """Start the cell's process (stopping the one it had) from an argv template; ``{ready_file}`` is filled in
        here, the rest from ``fields``. Returns the first line of its ready file."""
        await self.stop(cell_id)
        ready = self.workdir / f"{cell_id}.{self.kind}.ready"
        values = {**fields, "ready_file": str(ready)}
        child = ChildProcess(
            f"{self.kind} of {cell_id}", [a.format(**values) for a in argv], ready_file=ready,
            log_file=self.workdir / f"{cell_id}.{self.kind}.log",
        )  # fmt: skip
        line = await child.start(timeout=timeout, env=self.env)
        self[cell_id] = child
        return line

    async def stop(self, cell_id: str) -> None:
        """Stop the cell's process, if this actuator started one (one someone else started is not ours to stop)."""
        child = self.pop(cell_id, None)
        if child is not None:
            await child.stop()

    async def close(self) -> None:
        for cell_id in list(self):
            await self.stop(cell_id)
