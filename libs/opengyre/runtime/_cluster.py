"""The embedded event log as a JetStream cluster: 3 or 5 nats-servers on loopback, each with its own store."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from ._nats import ClusterMember, EmbeddedNats
from ._ports import free_port

__all__ = ["CLUSTER_SIZES", "NatsCluster"]

# A majority must stay up: 3 servers survive losing one, 5 two. An even size adds a server and no tolerance.
CLUSTER_SIZES = (3, 5)


class NatsCluster:
    """``size`` nats-servers (``n0`` … under ``store_dir``) routed to each other on ``host``.

    Client and monitoring ports are the servers' own (``-p -1``: bound by the server, read back from its ports
    file); route ports are picked free here, since every member must name them all before any of them starts. A
    member restarted keeps its ports, so clients and the other members find it where it was."""

    def __init__(
        self,
        store_dir: Path,
        size: int = 3,
        *,
        host: str = "127.0.0.1",
        name: str = "opengyre",
        config_file: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if size not in CLUSTER_SIZES:
            raise ValueError(f"a NATS cluster has {' or '.join(map(str, CLUSTER_SIZES))} servers, not {size}")
        self.store_dir = Path(store_dir).resolve()
        self.name = name
        routes = tuple(free_port(host) for _ in range(size))
        self.nodes = [
            EmbeddedNats(
                self.store_dir / f"n{i}",
                host=host,
                config_file=config_file,
                die_with_parent=die_with_parent,
                cluster=ClusterMember(f"n{i}", name, port, routes),
            )
            for i, port in enumerate(routes)
        ]

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated: the seeds a client connects with (it needs one up)."""
        return ",".join(n.url for n in self.nodes)

    def launch(self) -> None:
        """Start every member (from the main thread: see ``spawn``); ``wait_ready`` waits for them."""
        for node in self.nodes:
            node.launch()

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait until every member listens and JetStream has a meta leader (each member's ``/healthz`` is ok);
        the seed URLs."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        try:
            for node in self.nodes:
                self._wait_healthy(node, deadline)
        except RuntimeError:
            self.stop()
            raise
        return self.url

    def _wait_healthy(self, node: EmbeddedNats, deadline: float) -> None:
        while not _healthy(node.monitor_url):
            if time.monotonic() > deadline or node.proc is None or node.proc.poll() is not None:
                raise RuntimeError(f"NATS cluster {self.name}: server {node.store_dir.name} is not healthy")
            time.sleep(0.1)

    def restart(self, node: EmbeddedNats, timeout: float = 30.0) -> None:
        """Start a member that exited again, on its ports and store, and wait until it is current with the
        cluster (a member that fails raises RuntimeError)."""
        deadline = time.monotonic() + timeout
        node.stop()
        node.launch()
        node.wait_ready(timeout)
        self._wait_healthy(node, deadline)

    def start(self, timeout: float = 30.0, *, attempts: int = 3) -> str:
        """``launch`` and ``wait_ready``. A route port picked free may be taken before its server binds it (another
        process between the pick and the bind): then the members exit, and the cluster starts again on new ones."""
        for attempt in range(attempts):
            self.launch()
            try:
                return self.wait_ready(timeout)
            except RuntimeError:
                if attempt + 1 == attempts:
                    raise
                self._new_route_ports()
        raise AssertionError("unreachable")

    def _new_route_ports(self) -> None:
        host = self.nodes[0].host
        routes = tuple(free_port(host) for _ in self.nodes)
        for node, port in zip(self.nodes, routes, strict=True):
            node.cluster = ClusterMember(node.store_dir.name, self.name, port, routes)
            node.port = node.monitor_port = 0  # bound afresh too

    def stop(self, timeout: float = 10.0) -> None:
        for node in self.nodes:
            node.stop(timeout)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(monitor_url: str) -> bool:
    """``/healthz`` says ok: the server is up and its JetStream is current with the meta leader."""
    try:
        with urllib.request.urlopen(f"{monitor_url}/healthz", timeout=2.0) as resp:
            return bool(json.loads(resp.read()).get("status") == "ok")
    except (urllib.error.URLError, OSError, ValueError):
        return False
