"""No Docker engine runs here: check docker-compose.yml against the services and ports the code defines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from opengyre.config import PROXY_HTTP_PORT, SERVICE_PORTS
from opengyre.runtime import SERVICE_CLASSES

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_one_container_per_service_plus_nats_postgres_and_migrations() -> None:
    services = _compose()["services"]
    assert set(services) == {"nats", "postgres", "migrate", *SERVICE_CLASSES}
    assert set(SERVICE_PORTS) == set(SERVICE_CLASSES)


def test_each_service_runs_itself_on_its_own_port() -> None:
    services = _compose()["services"]
    for name, port in SERVICE_PORTS.items():
        svc = services[name]
        assert svc["command"] == ["service", "run", name, "--port", str(port)]
        assert f"{port}:{port}" in svc["ports"]
        env = svc["environment"]
        assert env["OPENGYRE_NATS_URL"] == "nats://nats:4222"
        assert env["OPENGYRE_DB_URL"].startswith("postgresql://") and "@postgres:5432/" in env["OPENGYRE_DB_URL"]
        assert env["OPENGYRE_HOST"] == "0.0.0.0"
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    proxy = services["proxy"]
    assert f"{PROXY_HTTP_PORT}:{PROXY_HTTP_PORT}" in proxy["ports"]
    assert proxy["environment"]["OPENGYRE_PROXY_HTTP_PORT"] == str(PROXY_HTTP_PORT)


def test_nats_has_jetstream_on_a_persistent_volume() -> None:
    compose = _compose()
    nats = compose["services"]["nats"]
    cmd = nats["command"]
    assert "-js" in cmd
    store = cmd[cmd.index("-sd") + 1]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in nats["volumes"]}
    assert store in mounts and mounts[store] in compose["volumes"]
    assert "4222:4222" in nats["ports"]
    pg = compose["services"]["postgres"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])


def test_the_image_runs_the_cli_that_defines_these_commands() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["opengyre"]' in docker
    assert "torch==2.13.0" in docker
    for root in ("libs", *(f"svc-{s}" for s in SERVICE_CLASSES)):
        assert f"COPY {root} ./{root}" in docker
    from typer.main import get_command

    from opengyre.cli import app

    cli = get_command(app)
    assert {"service", "db", "up", "down", "status", "events", "replay", "demo"} <= set(cli.commands)  # type: ignore[attr-defined]
    compose = _compose()
    assert compose["services"]["migrate"]["command"] == ["db", "migrate"]
