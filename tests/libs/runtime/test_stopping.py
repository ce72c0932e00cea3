"""A service asked to stop ends even when the nats-server it would say goodbye to is frozen (SIGSTOP).

Found live: a run's driver was stopped and its nats-server went down with it; the trainer (4.7 GB, mid-run) was
still running four minutes later, reconnecting. With the nats-server SIGSTOPped, a service asked to stop waits
out the NATS client's drain timeout (~27 s here, then exit 0) before this deadline; the test tells the two apart
by the exit status and the line the deadline writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opengyre.runtime import EXIT_STOP_HUNG, STOP_GRACE_ENV, EmbeddedNats, stop_grace_s, wait_ready

# A safety net for the test run only (a hung child fails the test instead of the suite), never a timing claim.
_NEVER = 240


def test_the_grace_comes_from_the_environment_and_bad_values_are_refused() -> None:
    assert stop_grace_s({}) == 20.0
    assert stop_grace_s({STOP_GRACE_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match=STOP_GRACE_ENV):
            stop_grace_s({STOP_GRACE_ENV: bad})


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats")  # its own: the test freezes it
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def _service(nats: EmbeddedNats, data_dir: Path, grace_s: str) -> tuple[subprocess.Popen[bytes], Path]:
    port_file = data_dir / "synth.port"
    env = {**os.environ, STOP_GRACE_ENV: grace_s}
    env.pop("OPENGYRE_SUPERVISOR_PID", None)
    argv = [sys.executable, "-m", "opengyre.cli", "service", "run", "synth", "--port", "0"]
    argv += ["--port-file", str(port_file), "--data-dir", str(data_dir), "--nats-url", nats.url]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, port_file


async def test_a_service_stopped_while_its_nats_server_is_frozen_exits_after_the_grace(
    own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    proc, port_file = _service(own_nats, tmp_path / "data", "1")
    try:
        await wait_ready(port_file, proc=proc, timeout=_NEVER)
        assert own_nats.proc is not None
        os.kill(own_nats.proc.pid, signal.SIGSTOP)  # the connection stays open; nothing answers on it
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=_NEVER)  # without the deadline: still running here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_STOP_HUNG, err.decode(errors="replace")[-2000:]
    assert b"svc-synth: did not stop within 1 s of being asked to" in err


async def test_an_orderly_stop_is_not_cut_short(own_nats: EmbeddedNats, tmp_path: Path) -> None:
    proc, port_file = _service(own_nats, tmp_path / "data", "120")  # a loaded machine's orderly stop fits
    try:
        await wait_ready(port_file, proc=proc, timeout=_NEVER)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=_NEVER)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert b"did not stop within" not in err
