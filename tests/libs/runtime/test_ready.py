"""``wait_ready``: a child's ready file is read once written; a child that exits first is named by its exit code
(not waited out); nothing written in time is a timeout."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from opengyre.runtime import ExitedBeforeReady, wait_ready

# Writes its ready file atomically, then stays until its stdin closes (so it is alive while we wait).
_WRITES = (
    "import os, sys; p = sys.argv[1]; open(p + '.tmp', 'w').write('4242\\n'); os.replace(p + '.tmp', p); "
    "sys.stdin.read()"
)
_EXITS = "import sys; sys.exit(3)"
_STAYS = "import sys; sys.stdin.read()"

Proc = subprocess.Popen[Any] | asyncio.subprocess.Process
Starter = Callable[[str, Path], Awaitable[Proc]]


async def _popen(code: str, path: Path) -> Proc:
    return subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE)


async def _asyncio(code: str, path: Path) -> Proc:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(path), stdin=subprocess.PIPE)


async def _finish(proc: Proc) -> int | None:
    assert proc.stdin is not None
    proc.stdin.close()
    if isinstance(proc, asyncio.subprocess.Process):
        return await proc.wait()
    return await asyncio.to_thread(proc.wait)


STARTERS = pytest.mark.parametrize("start", [_popen, _asyncio], ids=["popen", "asyncio"])


@STARTERS
async def test_returns_what_the_process_wrote(tmp_path: Path, start: Starter) -> None:
    path = tmp_path / "ready"
    proc = await start(_WRITES, path)
    try:
        assert await wait_ready(path, proc=proc, timeout=60) == "4242"
    finally:
        await _finish(proc)


@STARTERS
async def test_a_process_that_exits_first_is_named_by_its_exit_code(tmp_path: Path, start: Starter) -> None:
    path = tmp_path / "ready"
    proc = await start(_EXITS, path)
    with pytest.raises(ExitedBeforeReady, match="exited with 3") as info:
        await wait_ready(path, proc=proc, timeout=60)
    assert info.value.returncode == 3
    assert not path.exists()


async def test_a_process_reaped_already_is_reported_at_once(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _EXITS])
    assert proc.wait() == 3
    with pytest.raises(ExitedBeforeReady, match="exited with 3"):
        await wait_ready(tmp_path / "ready", proc=proc, timeout=60)


async def test_a_file_written_already_needs_no_process(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    path.write_text("http://127.0.0.1:1\n")
    assert await wait_ready(path, timeout=60) == "http://127.0.0.1:1"


async def test_an_empty_file_is_not_ready(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    path.touch()  # what a writer that is not atomic shows first
    with pytest.raises(TimeoutError, match="not written within"):
        await wait_ready(path, timeout=0.05)


async def test_an_empty_file_is_ready_when_existence_is_the_signal(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    path.touch()  # a launcher that only touches its ready file
    assert await wait_ready(path, timeout=60, require_text=False) == ""


@STARTERS
async def test_a_process_alive_but_silent_times_out(tmp_path: Path, start: Starter) -> None:
    path = tmp_path / "ready"
    proc = await start(_STAYS, path)
    try:
        with pytest.raises(TimeoutError, match="not written within"):
            await wait_ready(path, proc=proc, timeout=0.05)
    finally:
        assert await _finish(proc) == 0  # the wait left it alone: it ran on until told to stop
