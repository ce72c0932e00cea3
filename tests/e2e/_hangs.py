"""What a driver that stops moving leaves to read: the tests that run `opengyre train loop` as a process write its
output to a file, and an exception through the block that waits on it (pytest's timeout interrupting it, the
wait cancelled) first prints that output and the stack's service logs, which a pipe's captured output would have
lost with the test. No time limit of its own: pytest's is the one."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["report", "reporting", "run_driver"]


def report(data_dir: Path, *outputs: Path) -> str:
    """The outputs' text, then the last lines of each service log of the stack on ``data_dir``."""
    parts = [f"---- {o.name} ----\n{o.read_text(errors='replace')}" for o in outputs if o.is_file()]
    for path in sorted((data_dir / "logs").glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-25:]
        parts.append(f"---- {path.name} (last {len(lines)} lines) ----\n" + "\n".join(lines))
    return "\n".join(parts)


@contextlib.contextmanager
def reporting(data_dir: Path, *outputs: Path) -> Iterator[None]:
    """Print ``report`` when the block ends by any exception (pytest shows the test's stdout), then re-raise."""
    try:
        yield
    except BaseException:
        print(report(data_dir, *outputs))
        raise


def run_driver(argv: Sequence[str], *, env: dict[str, str], out: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end, its output (stdout and stderr) in ``out`` and in the result's ``stdout``."""
    with out.open("wb") as f:
        done = subprocess.run(list(argv), env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return subprocess.CompletedProcess(done.args, done.returncode, out.read_text(errors="replace"), "")
