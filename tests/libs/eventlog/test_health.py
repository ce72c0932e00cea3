"""The log's health probe: one HTTP client for the log's life (a client per check built an SSL context, most of
an idle service's CPU at one check a second), which still tells a server gone from one back again."""

from __future__ import annotations

from pathlib import Path

from opengyre.eventlog import EventLog
from opengyre.runtime import EmbeddedNats

from ..._polling import await_until


async def test_the_probe_reuses_its_client_and_follows_the_server_away_and_back(tmp_path: Path) -> None:
    nats = EmbeddedNats(tmp_path / "nats")
    nats.start()
    log = await EventLog.connect(nats.url, health_url=nats.monitor_url)
    try:
        assert (await log.health()).ok
        probe = log._probe  # the one client, made on the first check
        assert probe is not None
        client = probe._client
        assert client is not None
        assert (await log.health()).ok and probe._client is client
        nats.stop()
        down = await log.health()
        assert not down.ok and ("does not answer" in down.reason or "unreachable" in down.reason), down
        nats.start()  # the same ports: the probe asks on a new connection, never on one the old server closed

        async def healthy() -> bool:
            return (await log.health()).ok

        await await_until(healthy, "healthy again once the server is back")
        assert probe._client is client
    finally:
        await log.close()
        nats.stop()
    assert probe._client is None  # closed with the log
