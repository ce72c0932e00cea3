"""Settings: where the proxy's rollout engines come from (an option, the environment, what `up` recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.config import PROXY_HTTP, HttpLimits, Settings, SettingsError


def test_proxy_engines_come_from_the_option_then_the_environment_then_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENGYRE_PROXY_ENGINES", raising=False)
    tmp_path.mkdir(exist_ok=True)
    assert Settings.from_env(data_dir=tmp_path).proxy_engines == ()
    given = Settings.from_env(data_dir=tmp_path, proxy_engines=["http://a:30000", "vllm+http://b:8000"])
    given.record()  # what `opengyre up --engine ... --engine ...` does before starting the services
    assert Settings.from_env(data_dir=tmp_path).proxy_engines == ("http://a:30000", "vllm+http://b:8000")
    monkeypatch.setenv("OPENGYRE_PROXY_ENGINES", "http://c:1, http://d:2")
    assert Settings.from_env(data_dir=tmp_path).proxy_engines == ("http://c:1", "http://d:2")
    assert Settings.from_env(data_dir=tmp_path, proxy_engines=[]).proxy_engines == ()


def test_log_replicas_come_from_the_environment_and_are_bounded_as_jetstream_bounds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENGYRE_LOG_REPLICAS", raising=False)
    assert Settings.from_env(data_dir=tmp_path).log.replicas == 1
    monkeypatch.setenv("OPENGYRE_LOG_REPLICAS", "3")
    assert Settings.from_env(data_dir=tmp_path).log.replicas == 3
    for bad in ("0", "6", "three"):
        monkeypatch.setenv("OPENGYRE_LOG_REPLICAS", bad)
        with pytest.raises(SettingsError, match=r"(?i)replicas"):
            Settings.from_env(data_dir=tmp_path)


def test_http_limits_come_from_the_environment_and_travel_back_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in HttpLimits().to_env():
        monkeypatch.delenv(name, raising=False)
    assert Settings.from_env(data_dir=tmp_path).http == HttpLimits()
    monkeypatch.setenv("OPENGYRE_HTTP_MAX_BODY_BYTES", "1048576")
    monkeypatch.setenv("OPENGYRE_HTTP_HEADER_TIMEOUT_S", "2.5")
    got = Settings.from_env(data_dir=tmp_path).http
    assert (got.max_body_bytes, got.header_timeout_s, got.max_headers) == (1 << 20, 2.5, 100)
    assert HttpLimits.from_env(got.to_env()) == got  # what an engine process is handed reads back the same
    assert "body 1 MiB" in got.describe() and "within 2.5 s" in got.describe()
    for name, bad in (("OPENGYRE_HTTP_MAX_HEADERS", "many"), ("OPENGYRE_HTTP_MAX_HEADERS", "0")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(SettingsError, match=name):
            Settings.from_env(data_dir=tmp_path)


def test_the_services_entry_points_name_each_svc_folder_and_its_service_class() -> None:
    import importlib

    from opengyre.config import installed_services
    from opengyre.runtime import Service

    root = Path(__file__).resolve().parents[2]
    services = installed_services()
    assert sorted(services) == sorted(p.name.removeprefix("svc-") for p in root.glob("svc-*") if p.is_dir())
    for name, target in services.items():
        module, _, attr = target.partition(":")
        assert module == f"opengyre.{name}.service"
        assert issubclass(getattr(importlib.import_module(module), attr), Service)


def test_a_port_of_0_means_any_free_one_and_out_of_range_ones_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 0 was refused, so tests picked a free port and passed it on, racing whoever bound it first."""
    monkeypatch.setenv("OPENGYRE_SYNTH_PORT", "0")
    monkeypatch.setenv("OPENGYRE_PROXY_HTTP_PORT", "0")
    s = Settings.from_env(data_dir=tmp_path)
    assert s.ports["synth"] == 0 and s.proxy_http_port == 0
    assert {"synth", PROXY_HTTP} <= s.explicit_ports  # asked for: bound as given, no fallback needed
    for bad in ("-1", "65536", "http"):
        monkeypatch.setenv("OPENGYRE_SYNTH_PORT", bad)
        with pytest.raises(SettingsError, match=r"OPENGYRE_SYNTH_PORT=.* is not a port number"):
            Settings.from_env(data_dir=tmp_path)
