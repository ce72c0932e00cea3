"""Wait for a child to say it is ready by writing a file (its URL, its port, or just "ready"), or to exit first."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from ..retry import backoff

__all__ = ["ExitedBeforeReady", "wait_ready"]

log = logging.getLogger(__name__)


class ExitedBeforeReady(RuntimeError):
    """The process exited before it wrote its ready file; ``returncode`` is its exit status."""

    def __init__(self, path: Path, returncode: int) -> None:
        self.path = path
        self.returncode = returncode
        super().__init__(f"the process exited with {returncode} before writing {path}")


class _NotWritten(Exception):
    pass


async def wait_ready(
    path: Path,
    *,
    proc: subprocess.Popen[Any] | asyncio.subprocess.Process | None = None,
    timeout: float = 60.0,
    require_text: bool = True,
) -> str:
    """The stripped text of ``path`` once it is written: not empty, or, with ``require_text=False``, once it exists
    (a launcher may only touch it; the text may then be ""). ``proc``: the process that writes it; if it exits
    first, ``ExitedBeforeReady`` names its exit code. ``TimeoutError`` after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            return await _ready_or_exited(path, proc, require_text)
    except TimeoutError:
        raise TimeoutError(f"{path} not written within {timeout:g} s") from None


async def _ready_or_exited(
    path: Path, proc: subprocess.Popen[Any] | asyncio.subprocess.Process | None, require_text: bool
) -> str:
    if proc is None:
        return await _written(path, require_text)
    written = asyncio.ensure_future(_written(path, require_text))
    exited = asyncio.ensure_future(_exit_code(proc))
    try:
        done, _ = await asyncio.wait({written, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (written, exited):
            task.cancel()
        await asyncio.gather(written, exited, return_exceptions=True)
    if written in done:
        return written.result()
    code = exited.result()
    text = _read(path)  # written just before it exited: it was ready (what the caller makes of its exit is theirs)
    if text is not None and (text or not require_text):
        return text
    raise ExitedBeforeReady(path, code)


def _read(path: Path) -> str | None:
    """The file's stripped text; None while it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    return None


async def _written(path: Path, require_text: bool) -> str:
    # Nothing notifies a file's appearing short of inotify (no dependency of ours): polled, through the one retry
    # policy. Not empty, too: a writer that is not atomic shows an empty file first.
    async for attempt in backoff(f"waiting for {path}", first_s=0.01, max_s=0.1, retry_on=_NotWritten,
                                 logger=log, log_level=logging.DEBUG):  # fmt: skip
        with attempt:
            text = _read(path)
            if text is None or (require_text and not text):
                raise _NotWritten(f"{path} not written yet")
            return text
    raise AssertionError("unreachable: backoff retries until written or cancelled")


@functools.singledispatch
async def _exit_code(proc: object) -> int:
    raise TypeError(f"cannot wait for a {type(proc).__name__} to exit")


@_exit_code.register(asyncio.subprocess.Process)
async def _(proc: asyncio.subprocess.Process) -> int:
    return await proc.wait()


@_exit_code.register(subprocess.Popen)
async def _(proc: subprocess.Popen[Any]) -> int:
    """Notified by the kernel (a pidfd is readable once the process exits), not polled; no thread held."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # gone between the poll and the open
        return proc.wait()
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await gone
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()  # a zombie now: returns at once
