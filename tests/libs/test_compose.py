"""No Docker engine (nor compose CLI) runs here: docker-compose.yml is validated against the official
compose-spec JSON schema (check-jsonschema's vendored copy) and checked against what the code defines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from opengyre.config import PROXY_HTTP_PORT, SERVICE_PORTS
from opengyre.runtime import SERVICE_CLASSES, nats_server_binary
from tests._nats_ports import spawn_nats

ROOT = Path(__file__).resolve().parents[2]
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_file_is_valid_under_the_compose_spec_schema(tmp_path: Path) -> None:
    ok = _validate(ROOT / "docker-compose.yml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The validator is live: a condition compose does not know is refused.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("service_healthy", "service_ready", 1))
    bad = _validate(broken)
    assert bad.returncode == 1 and "service_ready" in bad.stdout + bad.stderr


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """Container path -> named volume of a service's short-syntax volumes."""
    return {m.split(":")[1]: m.split(":")[0] for m in svc.get("volumes", [])}


def test_every_service_keeps_its_data_dir_on_a_named_volume() -> None:
    """Before: /data was the container's own layer, so the proxy's API-key secret changed on re-creation."""
    compose = _compose()
    for name in SERVICE_CLASSES:
        svc = compose["services"][name]
        data_dir = svc["environment"]["OPENGYRE_DATA_DIR"]
        assert _mounts(svc).get(data_dir) in compose["volumes"], name


def test_the_scheduler_reaches_the_proxy_by_its_service_address() -> None:
    """Before: the default was OPENGYRE_HOST:port, and OPENGYRE_HOST is 0.0.0.0, the scheduler's own container."""
    services = _compose()["services"]
    addr = services["scheduler"]["environment"]["OPENGYRE_SCHEDULER_PROXY_ADDR"]
    host, _, port = addr.rpartition(":")
    assert host in services and host != "scheduler" and int(port) == SERVICE_PORTS[host]


def test_services_wait_for_a_healthy_nats_and_the_healthcheck_answers_on_a_real_server(tmp_path: Path) -> None:
    """Before: no healthcheck, so services waited only for the container to start."""
    compose = _compose()
    nats = compose["services"]["nats"]
    for name in SERVICE_CLASSES:
        assert compose["services"][name]["depends_on"]["nats"]["condition"] == "service_healthy", name
    check = nats["healthcheck"]["test"]
    assert check[:2] == ["CMD", "wget"]  # the alpine image has busybox wget and no curl
    url = check[-1]
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/healthz.*)", url)
    assert m is not None, url
    cmd = nats["command"]
    assert cmd[cmd.index("-m") + 1] == m.group(1)  # the monitoring port the healthcheck asks is the one opened
    # The same command line on the nats-server we ship (the image's is 2.10), on ports it picks itself.
    args = [a if a != "/data/jetstream" else str(tmp_path) for a in cmd]
    i = args.index("-m")
    del args[i : i + 2]  # spawn_nats asks for any free monitoring port
    proc, ports = spawn_nats(nats_server_binary(), args, tmp_path / "ports")
    try:
        r = httpx.get(f"http://127.0.0.1:{ports.monitor}{m.group(2)}", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    finally:
        proc.terminate()
        proc.wait()


def test_no_secret_is_committed_and_nothing_internal_is_published() -> None:
    """Before: PostgreSQL (with a fixed password) and NATS monitoring were published on the host."""
    text = (ROOT / "docker-compose.yml").read_text()
    compose = _compose()
    pg = compose["services"]["postgres"]
    assert "ports" not in pg
    assert re.fullmatch(r"\$\{OPENGYRE_PG_PASSWORD:\?[^}]+\}", pg["environment"]["POSTGRES_PASSWORD"])
    for name in SERVICE_CLASSES:
        url = compose["services"][name]["environment"]["OPENGYRE_DB_URL"]
        assert "${OPENGYRE_PG_PASSWORD:?" in url, name  # required: no default password anywhere
    assert text.count("OPENGYRE_PG_PASSWORD:-") == 0
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    nats_ports = compose["services"]["nats"]["ports"]
    assert all(p.startswith("127.0.0.1:") for p in nats_ports) and not any(":8222" in p for p in nats_ports)


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
    mounts = _mounts(nats)
    assert store in mounts and mounts[store] in compose["volumes"]
    assert "127.0.0.1:4222:4222" in nats["ports"]
    pg = compose["services"]["postgres"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])


def test_the_image_runs_the_cli_that_defines_these_commands() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["opengyre"]' in docker
    assert "torch==2.13.0" in docker
    for root in ("libs", "apps", *(f"svc-{s}" for s in SERVICE_CLASSES)):
        assert f"COPY {root} ./{root}" in docker
    from typer.main import get_command

    from opengyre.cli import app

    cli = get_command(app)
    assert {"service", "db", "up", "down", "status", "events", "replay", "demo"} <= set(cli.commands)  # type: ignore[attr-defined]
    compose = _compose()
    assert compose["services"]["migrate"]["command"] == ["db", "migrate"]
