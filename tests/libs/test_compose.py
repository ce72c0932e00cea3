"""The compose files against the official compose-spec JSON schema (check-jsonschema's vendored copy) and against
what the code defines, with no Docker engine: the suite must not need one. Running them for real is
`make compose-check` (tests/deploy/test_compose_up.py, opt-in: it skips, saying so, where no daemon answers)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _nats_args(nats: dict[str, Any]) -> list[str]:
    """The nats-server arguments of the compose file's NATS container (its command is a shell line that writes the
    password into a config file first)."""
    [line] = nats["command"]
    m = re.search(r"exec nats-server (.*)$", line)
    assert m is not None, line
    return shlex.split(m.group(1))


def test_services_wait_for_a_healthy_nats_and_the_healthcheck_answers_on_a_real_server(tmp_path: Path) -> None:
    """Before: no healthcheck, so services waited only for the container to start."""
    compose = _compose()
    nats = compose["services"]["nats"]
    for name in SERVICE_CLASSES:
        assert compose["services"][name]["depends_on"]["nats"]["condition"] == "service_healthy", name
    check = nats["healthcheck"]["test"]
    assert check[:4] == ["CMD", "python", "-m", "opengyre.healthcheck"]
    url = check[-1]
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/healthz.*)", url)
    assert m is not None, url
    cmd = _nats_args(nats)
    assert cmd[cmd.index("-m") + 1] == m.group(1)  # the monitoring port the healthcheck asks is the one opened
    # The same command line on the nats-server we ship, with the password file the container writes, on ports it
    # picks itself; the healthcheck module answers 0 against it and 1 against nothing.
    conf = tmp_path / "auth.conf"
    conf.write_text('authorization { user: opengyre, password: "x" }\n')
    args = [str(conf) if a == "/tmp/auth.conf" else str(tmp_path) if a == "/data/jetstream" else a for a in cmd]
    i = args.index("-m")
    del args[i : i + 2]  # spawn_nats asks for any free monitoring port
    proc, ports = spawn_nats(nats_server_binary(), args, tmp_path / "ports")
    try:
        probe = [sys.executable, "-m", "opengyre.healthcheck", "0"]
        ok = subprocess.run([*probe, f"http://127.0.0.1:{ports.monitor}{m.group(2)}"], capture_output=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
    finally:
        proc.terminate()
        proc.wait()
    down = subprocess.run([*probe, f"http://127.0.0.1:{ports.monitor}{m.group(2)}"], capture_output=True, timeout=60)
    assert down.returncode == 1 and b"healthz" in down.stderr


def test_no_secret_is_committed_and_nothing_internal_is_published() -> None:
    """Before: PostgreSQL (with a fixed password) and NATS monitoring were published on the host."""
    text = (ROOT / "docker-compose.yml").read_text()
    compose = _compose()
    pg = compose["services"]["postgres"]
    assert "ports" not in pg
    assert re.fullmatch(r"\$\{OPENGYRE_PG_PASSWORD:\?[^}]+\}", pg["environment"]["OPENGYRE_PG_PASSWORD"])
    nats_password = compose["services"]["nats"]["environment"]["OPENGYRE_NATS_PASSWORD"]
    assert re.fullmatch(r"\$\{OPENGYRE_NATS_PASSWORD:\?[^}]+\}", nats_password)  # NATS is not open either
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
    cmd = _nats_args(nats)
    assert "-js" in cmd
    store = cmd[cmd.index("-sd") + 1]
    mounts = _mounts(nats)
    [mount] = [m for m in mounts if store.startswith(m.rstrip("/") + "/")]
    assert mounts[mount] in compose["volumes"]
    assert "127.0.0.1:4222:4222" in nats["ports"]
    pg = compose["services"]["postgres"]
    assert any(v.endswith(":/var/lib/postgresql") for v in pg["volumes"])


def test_the_image_runs_the_cli_that_defines_these_commands() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["opengyre"]' in docker
    assert "torch==2.13.0" in docker
    # no registry: FROM the debootstrapped base, every install from the wheelhouse
    [base] = re.findall(r"^FROM (.+)$", docker, re.M)
    assert base == "${BASE}" and "ARG BASE=opengyre-base:bookworm" in docker
    installs = re.findall(r"pip install [^\n]*", docker)
    assert installs and all("--no-index" in i for i in installs), installs
    images = {svc.get("image") for svc in _compose()["services"].values()} | {_compose()["x-service"]["image"]}
    assert images == {"opengyre:latest", "opengyre-postgres:bookworm"}
    from typer.main import get_command

    from opengyre.cli import app

    cli = get_command(app)
    assert {"service", "db", "up", "down", "status", "events", "replay", "demo"} <= set(cli.commands)  # type: ignore[attr-defined]
    compose = _compose()
    assert compose["services"]["migrate"]["command"] == ["db", "migrate"]


def _host_files() -> dict[str, dict[str, Any]]:
    return {p: yaml.safe_load((ROOT / "deploy" / p).read_text()) for p in ("compose.host.yml", "compose.cluster.yml")}


def test_the_host_network_files_are_valid_and_keep_everything_on_loopback() -> None:
    """deploy/compose.host.yml (and the cluster file on top): the same stack where Docker's bridge is not to be used
    — host network, every listener and every address 127.0.0.1, nothing published, no port of the host's own."""
    for name in _host_files():
        ok = _validate(ROOT / "deploy" / name)
        assert ok.returncode == 0, name + ok.stdout + ok.stderr
    host = _host_files()["compose.host.yml"]
    text = (ROOT / "deploy" / "compose.host.yml").read_text()
    assert set(host["services"]) == {"nats", "postgres", "migrate", "engine", *SERVICE_CLASSES}
    for name, svc in host["services"].items():
        assert svc.get("network_mode", host["x-service"]["network_mode"]) == "host", name
        assert "ports" not in svc, name
    env = host["x-env"]
    urls = [env["OPENGYRE_NATS_URL"], env["OPENGYRE_DB_URL"], env["OPENGYRE_PROXY_ENGINES"]]
    assert all("@127.0.0.1:" in u or "//127.0.0.1:" in u for u in urls), urls
    assert env["OPENGYRE_HOST"] == "127.0.0.1" and "0.0.0.0" not in text
    for port in ("4222", "5432", "8080", *map(str, SERVICE_PORTS.values())):  # the host's NATS/PG, the embedded stack
        assert not re.search(rf":{port}\b", text), port
    cluster = _host_files()["compose.cluster.yml"]
    seeds = cluster["x-env"]["OPENGYRE_NATS_URL"].split(",")
    assert len(seeds) == 3 and cluster["x-env"]["OPENGYRE_LOG_REPLICAS"] == "3"
    for name in SERVICE_CLASSES:
        assert cluster["services"][name]["environment"]["OPENGYRE_NATS_URL"] == ",".join(seeds), name
