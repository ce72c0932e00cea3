"""Settings: data dir, NATS and database URLs, service ports; from arguments, environment, or defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from ..eventlog import LogConfig
from ..store import sqlite_url

__all__ = ["SERVICE_PORTS", "Settings"]

# Default gRPC ports of the five services (docker-compose.yml publishes the same), and the proxy's HTTP port.
SERVICE_PORTS: dict[str, int] = {
    "synth": 50051,
    "scheduler": 50052,
    "proxy": 50053,
    "trainer": 50054,
    "bench": 50055,
}
PROXY_HTTP_PORT = 8080

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
    db_url: str | None = None  # None: SQLite in data_dir
    log: LogConfig = field(default_factory=LogConfig)
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(SERVICE_PORTS))
    proxy_http_port: int = PROXY_HTTP_PORT

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env = os.environ
        s = cls(
            data_dir=Path(env.get("OPENGYRE_DATA_DIR", ".opengyre")),
            nats_url=env.get("OPENGYRE_NATS_URL") or None,
            db_url=env.get("OPENGYRE_DB_URL") or None,
            log=LogConfig(
                stream=env.get("OPENGYRE_STREAM", "OPENGYRE"),
                prefix=env.get("OPENGYRE_SUBJECT_PREFIX", "og.ev"),
                max_bytes=_env_number(env, "OPENGYRE_LOG_MAX_BYTES", int, -1),
                payload_max_bytes=_env_number(env, "OPENGYRE_PAYLOAD_MAX_BYTES", int, -1),
                payload_max_age_s=_env_number(env, "OPENGYRE_PAYLOAD_MAX_AGE_S", float, 0.0),
            ),
            host=env.get("OPENGYRE_HOST", "127.0.0.1"),
            ports={k: int(env.get(f"OPENGYRE_{k.upper()}_PORT", v)) for k, v in SERVICE_PORTS.items()},
            proxy_http_port=int(env.get("OPENGYRE_PROXY_HTTP_PORT", PROXY_HTTP_PORT)),
        )
        clean = {k: v for k, v in overrides.items() if v is not None}
        return replace(s, **clean) if clean else s  # type: ignore[arg-type]

    @property
    def database_url(self) -> str:
        return self.db_url or sqlite_url(self.data_dir)

    @property
    def nats_url_file(self) -> Path:
        return self.data_dir / "nats.url"

    @property
    def stack_file(self) -> Path:
        return self.data_dir / "stack.json"

    def resolved_nats_url(self) -> str | None:
        """The given URL, else the embedded server's URL recorded in the data dir by ``opengyre up``."""
        if self.nats_url:
            return self.nats_url
        f = self.nats_url_file
        if f.exists():
            return f.read_text().strip() or None
        return None
