"""A bare nats-server on ports it picks itself (``-p -1``, ``-m -1``), read back from its ports file.

A port picked with ``free_port()`` and bound later by the server races other xdist workers for it; the
server binding any free port and writing where it listens (``--ports_file_dir``) cannot."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests._polling import wait_until


@dataclass(frozen=True)
class NatsPorts:
    client: int
    monitor: int


def spawn_nats(binary: Path, args: list[str], ports_dir: Path) -> tuple[subprocess.Popen[bytes], NatsPorts]:
    """Start ``binary`` with ``args`` on 127.0.0.1, any free client and monitoring port; the ports file is
    written once both listen, so its ports answer when this returns."""
    ports_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), *args, "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir", str(ports_dir)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    ports_file = ports_dir / f"{binary.name}_{proc.pid}.ports"

    ports: dict[str, list[str]] = {}

    def written() -> bool:
        assert proc.poll() is None, f"nats-server exited with {proc.returncode}: {cmd}"
        try:
            ports.update(json.loads(ports_file.read_text()))
        except (FileNotFoundError, ValueError):  # not yet, or half written
            return False
        return True

    try:
        wait_until(written, f"nats-server to write {ports_file}")
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    return proc, NatsPorts(client=_port(ports["nats"][0]), monitor=_port(ports["monitoring"][0]))


def _port(url: str) -> int:
    return int(url.rpartition(":")[2])
