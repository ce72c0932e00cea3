"""Settings: data dir, NATS and database URLs, stream, service ports.

Each value comes from, in order: an argument (a CLI option), the environment (``OPENGYRE_*``), what the last
``opengyre up`` on the data dir recorded (``<data dir>/settings.json``), a default. So `replay`, `status` and
every other command read the store and stream the stack really uses, with no option repeated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from ..eventlog import LogConfig
from ._http import HttpLimits
from ._secrets import GRPC_TOKEN_ENV, ensure_grpc_token, grpc_token_file, new_secret, read_grpc_token, write_secret

__all__ = [
    "GRPC_TOKEN_ENV",
    "NATS_CLUSTER_ENV",
    "PROXY_HTTP",
    "PROXY_HTTP_PORT",
    "SERVICES_GROUP",
    "SERVICE_PORTS",
    "HttpLimits",
    "Settings",
    "SettingsError",
    "ensure_grpc_token",
    "grpc_token_file",
    "installed_services",
    "new_secret",
    "read_grpc_token",
    "read_recorded",
    "write_secret",
]

# The entry-point group naming each service's class (pyproject's [project.entry-points."opengyre.services"]).
SERVICES_GROUP = "opengyre.services"


def installed_services() -> dict[str, str]:
    """Each installed service's class (``module:attr``) by service name, from the ``opengyre.services`` entry
    points: the kernel names no service (issue 25). Sorted by name, as installers do not keep the declared order."""
    out: dict[str, str] = {}
    for ep in sorted(entry_points(group=SERVICES_GROUP), key=lambda e: e.name):
        out.setdefault(ep.name, ep.value)
    return out


# Default gRPC ports of the five services (docker-compose.yml publishes the same), and the proxy's HTTP port.
SERVICE_PORTS: dict[str, int] = {
    "synth": 50051,
    "scheduler": 50052,
    "proxy": 50053,
    "trainer": 50054,
    "bench": 50055,
}
PROXY_HTTP_PORT = 8080
# The key of the proxy's HTTP port in ``Settings.explicit_ports``.
PROXY_HTTP = "proxy_http"
# What `opengyre up` records for the commands that come after it.
RECORDED = ("nats_url", "db_url", "stream", "prefix", "proxy_engines", "host")


class SettingsError(ValueError):
    """A setting that cannot be honoured (a bad value in the environment, an unreadable settings file)."""


N = TypeVar("N", int, float)


def _env_number(env: Mapping[str, str], name: str, kind: Callable[[str], N], default: N) -> N:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {kind.__name__}") from None


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(".opengyre")
    nats_url: str | None = None  # None: start the embedded nats-server in data_dir
    # The embedded log as a JetStream cluster of this many nats-servers (3 or 5; 0: one server).
    # `opengyre up --nats-cluster`, OPENGYRE_NATS_CLUSTER.
    nats_cluster: int = 0
    # nats-server's HTTP monitoring (the supervisor passes its embedded server's): health beyond "connected".
    nats_monitor_url: str | None = None
    db_url: str | None = None  # None: one SQLite file per service in data_dir/db
    log: LogConfig = field(default_factory=LogConfig)
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(SERVICE_PORTS))
    proxy_http_port: int = PROXY_HTTP_PORT
    # Ports the user asked for (by environment): taken, they are an error instead of a fallback to a free one.
    explicit_ports: frozenset[str] = frozenset()
    # The supervisor restarts a nats-server whose store failed a write once this much space is free again.
    log_min_free_mb: int = 64
    # Rollout engines the proxy routes to from the start (``http://`` SGLang or the CPU engine, ``vllm+http://``
    # vLLM); more join through scheduler cells or gRPC AddEngine. `opengyre up --engine`, OPENGYRE_PROXY_ENGINES.
    proxy_engines: tuple[str, ...] = ()
    # The services' gRPC bearer token (OPENGYRE_GRPC_TOKEN); None: the data dir's (``grpc_token()``).
    grpc_token_override: str | None = None
    # What one HTTP client can make the gateway, an engine or /metrics hold (OPENGYRE_HTTP_*, docs/security.md).
    http: HttpLimits = field(default_factory=HttpLimits)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env = os.environ
        clean = {k: v for k, v in overrides.items() if v is not None}
        data_dir = Path(clean.pop("data_dir", None) or env.get("OPENGYRE_DATA_DIR", ".opengyre"))  # type: ignore[arg-type]
        recorded = read_recorded(data_dir)

        def pick(key: str, env_name: str, default: str | None) -> str | None:
            if key in clean:
                return str(clean.pop(key))
            if env.get(env_name):
                return env[env_name]
            value = recorded.get(key)
            return str(value) if value else default

        explicit: set[str] = set()
        ports = dict(SERVICE_PORTS)
        for name in SERVICE_PORTS:
            raw = env.get(f"OPENGYRE_{name.upper()}_PORT")
            if raw:
                ports[name] = _port(f"OPENGYRE_{name.upper()}_PORT", raw)
                explicit.add(name)
        http = env.get("OPENGYRE_PROXY_HTTP_PORT")
        if http:
            explicit.add(PROXY_HTTP)
        cluster = clean.pop("nats_cluster", None)
        try:
            nats_cluster = _nats_cluster(str(cluster) if cluster is not None else env.get(NATS_CLUSTER_ENV, ""))
            log = LogConfig(
                stream=pick("stream", "OPENGYRE_STREAM", "OPENGYRE") or "OPENGYRE",
                prefix=pick("prefix", "OPENGYRE_SUBJECT_PREFIX", "og.ev") or "og.ev",
                max_bytes=_env_number(env, "OPENGYRE_LOG_MAX_BYTES", int, -1),
                payload_max_bytes=_env_number(env, "OPENGYRE_PAYLOAD_MAX_BYTES", int, -1),
                payload_max_age_s=_env_number(env, "OPENGYRE_PAYLOAD_MAX_AGE_S", float, 0.0),
                compression=env.get("OPENGYRE_LOG_COMPRESSION", "").strip() or "s2",
                # On a cluster the log is replicated 3 times (NATS's recommendation; 5 with OPENGYRE_LOG_REPLICAS)
                replicas=_env_number(env, "OPENGYRE_LOG_REPLICAS", int, 3 if nats_cluster else 1),
            )
            http_limits = HttpLimits.from_env(env)
        except ValueError as exc:
            raise SettingsError(str(exc)) from exc
        if "proxy_engines" in clean:
            engines = tuple(str(u) for u in clean.pop("proxy_engines"))  # type: ignore[attr-defined]
        elif env.get("OPENGYRE_PROXY_ENGINES"):
            engines = tuple(u.strip() for u in env["OPENGYRE_PROXY_ENGINES"].split(",") if u.strip())
        else:
            engines = tuple(str(u) for u in recorded.get("proxy_engines") or [])
        s = cls(
            proxy_engines=engines,
            data_dir=data_dir,
            nats_url=pick("nats_url", "OPENGYRE_NATS_URL", None),
            nats_cluster=nats_cluster,
            nats_monitor_url=env.get("OPENGYRE_NATS_MONITOR_URL") or None,
            db_url=pick("db_url", "OPENGYRE_DB_URL", None),
            log=log,
            # Loopback unless asked (`opengyre up --host`, recorded): any address here opens the gRPC ports and the
            # proxy's HTTP gateway to whoever can reach it.
            host=pick("host", "OPENGYRE_HOST", "127.0.0.1") or "127.0.0.1",
            grpc_token_override=env.get(GRPC_TOKEN_ENV, "").strip() or None,
            ports=ports,
            proxy_http_port=_port("OPENGYRE_PROXY_HTTP_PORT", http) if http else PROXY_HTTP_PORT,
            explicit_ports=frozenset(explicit),
            log_min_free_mb=int(env.get("OPENGYRE_LOG_MIN_FREE_MB", "64")),
            http=http_limits,
        )
        return replace(s, **clean) if clean else s  # type: ignore[arg-type]

    def store_url(self, service: str) -> str:
        """The projection store of one service: ``db_url`` when given (PostgreSQL: one database, each service
        its own tables), else the service's own SQLite file, so no two processes write one SQLite file."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{self.data_dir.resolve() / 'db' / f'{service}.db'}"

    def ensure_store_dir(self) -> None:
        if not self.db_url:
            (self.data_dir / "db").mkdir(parents=True, exist_ok=True)

    def store_urls(self, services: list[str] | None = None) -> dict[str, str]:
        return {name: self.store_url(name) for name in (services or list(SERVICE_PORTS))}

    @property
    def nats_url_file(self) -> Path:
        return self.data_dir / "nats.url"

    @property
    def stack_file(self) -> Path:
        return self.data_dir / "stack.json"

    @property
    def settings_file(self) -> Path:
        return self.data_dir / "settings.json"

    def record(self) -> None:
        """Write what later commands must agree on (``opengyre up`` does, before anything starts)."""
        data = {
            "nats_url": self.nats_url,
            "db_url": self.db_url,
            "stream": self.log.stream,
            "prefix": self.log.prefix,
            "proxy_engines": list(self.proxy_engines),
            "host": self.host,
        }
        tmp = self.settings_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.settings_file)

    def grpc_token(self) -> str | None:
        """The bearer token the services require: OPENGYRE_GRPC_TOKEN, else the data dir's (None: none yet)."""
        return self.grpc_token_override or read_grpc_token(self.data_dir)

    def resolved_nats_url(self) -> str | None:
        """The given URL, else the embedded server's URL recorded in the data dir by ``opengyre up``."""
        if self.nats_url:
            return self.nats_url
        f = self.nats_url_file
        if f.exists():
            return f.read_text().strip() or None
        return None


NATS_CLUSTER_ENV = "OPENGYRE_NATS_CLUSTER"


def _nats_cluster(value: str) -> int:
    """The cluster size asked for: 3 or 5 servers (a majority of them must stay up), 0 or empty for one server."""
    raw = value.strip()
    if raw in ("", "0"):
        return 0
    if raw not in ("3", "5"):
        raise ValueError(f"{NATS_CLUSTER_ENV} / --nats-cluster is 3 or 5 servers (0: one server), not {raw!r}")
    return int(raw)


def read_recorded(data_dir: Path) -> dict[str, Any]:
    f = data_dir / "settings.json"
    if not data_dir.is_dir():
        return {}  # nothing recorded; whoever needs the data dir says what is wrong with it
    try:
        data = json.loads(f.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SettingsError(f"cannot read {f}: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"{f} is not a JSON object")
    return {k: v for k, v in data.items() if k in RECORDED}


def _port(name: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a port number") from None
    # 0: any free port, bound by the service itself and reported (`stack.json`, `proxy.url`), so nothing picks a
    # port that another process can take before it is bound.
    if not 0 <= port < 65536:
        raise SettingsError(f"{name}={port} is not a port number (1-65535, or 0 for any free one)")
    return port
