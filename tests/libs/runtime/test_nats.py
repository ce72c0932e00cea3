"""The embedded nats-server binds its ports itself and reports them; a restart binds the same ones again."""

from __future__ import annotations

from pathlib import Path

import httpx

from opengyre.runtime import EmbeddedNats


def test_servers_launched_at_once_bind_distinct_ports_they_report_and_a_restart_keeps_them(tmp_path: Path) -> None:
    """Before: the ports were picked (free then) and bound later, so a parallel test could take one in between."""
    servers = [EmbeddedNats(tmp_path / x) for x in "ab"]
    try:
        for s in servers:
            s.launch()
        urls = [s.wait_ready() for s in servers]
        ports = {p for s in servers for p in (s.port, s.monitor_port)}
        assert len(ports) == 4 and 0 not in ports, urls
        for s in servers:
            assert httpx.get(f"{s.monitor_url}/healthz", timeout=10).json()["status"] == "ok"
        a = servers[0]
        before = (a.url, a.monitor_url)
        a.stop()
        assert a.start() == before[0] and a.monitor_url == before[1]  # clients keep the address across a restart
        assert httpx.get(f"{a.monitor_url}/healthz", timeout=10).json()["status"] == "ok"
    finally:
        for s in servers:
            s.stop()
