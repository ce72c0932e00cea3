"""What a driver that stops moving leaves to read: the tests that run `opengyre train loop` as a process bound it
below pytest's own timeout (which would end the test with the driver's output lost) and fail with its output,
the stack's service logs and the log's last events instead."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["DRIVER_TIMEOUT_S", "report", "run_driver"]

DRIVER_TIMEOUT_S = 240.0  # below pytest's 300 s: a hang is reported by the test, with what it knows


def report(data_dir: Path, *outputs: str) -> str:
    """The outputs given, then the last lines of each service log of the stack on ``data_dir``."""
    parts = [o for o in outputs if o]
    for path in sorted((data_dir / "logs").glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-25:]
        parts.append(f"---- {path.name} (last {len(lines)} lines) ----\n" + "\n".join(lines))
    return "\n".join(parts)


def run_driver(
    argv: Sequence[str], *, env: dict[str, str], data_dir: Path, out: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end, or failed at ``DRIVER_TIMEOUT_S`` with what it printed and the stack's logs."""
    try:
        if out is None:
            return subprocess.run(
                list(argv), env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=DRIVER_TIMEOUT_S
            )
        with out.open("wb") as f:
            done = subprocess.run(
                list(argv), env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=DRIVER_TIMEOUT_S,
            )  # fmt: skip
        return subprocess.CompletedProcess(done.args, done.returncode, out.read_text(errors="replace"), "")
    except subprocess.TimeoutExpired as exc:
        said = out.read_text(errors="replace") if out is not None else _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"the driver did not end within {DRIVER_TIMEOUT_S:g} s\n{report(data_dir, said)}")


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else raw.decode(errors="replace")
