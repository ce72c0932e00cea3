"""Bounds on what one HTTP client can make a server of the stack hold (issue 24 item 5): the proxy's gateway, the
CPU engine and the trainer's ``/metrics`` all serve with these. One place for the values, their environment
variables and what each means (docs/security.md shows the same table; `opengyre status` prints it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["HttpLimits"]

_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class HttpLimits:
    # The request line and all header lines together (nginx: 4 x 8 KiB buffers, h11 and Node: 16 KiB). Over: 431.
    max_header_bytes: int = 32 * _KIB
    max_headers: int = 100  # header lines per request (Python's http.client says 100 too). Over: 431.
    # A request body (Anthropic's documented cap on a Messages request: long agent contexts are legal). Over: 413,
    # answered from the declared Content-Length before the body is read, or as soon as a chunked body passes it.
    max_body_bytes: int = 32 * _MIB
    # From a connection's accept (or a request's first byte) to its last header byte: a slowloris client that
    # trickles a header byte every few seconds is answered 408 and closed after this. nginx: 60 s.
    header_timeout_s: float = 10.0
    # The longest silence while a body is being sent (not counted while the app has not read what came). 408.
    body_timeout_s: float = 30.0
    keep_alive_s: float = 75.0  # an idle kept-alive connection is closed after this (nginx's default)
    # The longest a response may wait on a client that stops reading it (the socket's buffers full, nothing taken):
    # past it the connection is closed and the app sees its client leave. nginx's send_timeout: 60 s.
    write_timeout_s: float = 60.0
    # Open connections of one client address, and of everyone; over either: 503 with Retry-After, then closed.
    # Every harness in a sandbox reaches the gateway through the loopback relay, so they all count as one client
    # there: the per-client cap is for a stack exposed with `--host`, and stays above the engines' pools.
    max_connections_per_client: int = 1024
    max_connections: int = 4096

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{_env_name(f.name)} must be positive, got {getattr(self, f.name)!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HttpLimits:
        """Each limit from ``OPENGYRE_HTTP_<NAME>`` where set (``ValueError`` naming the variable otherwise)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = _env_name(f.name)
            raw = env.get(name, "").strip()
            if not raw:
                continue
            kind = float if f.name.endswith("_s") else int
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not {'a number' if kind is float else 'an integer'}") from None
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The variables ``from_env`` reads back to these limits (what a child process is handed)."""
        return {_env_name(f.name): str(getattr(self, f.name)) for f in fields(self)}

    def describe(self) -> str:
        """One line for `opengyre up` and `status`."""
        v = {f.name: _shown(f.name, getattr(self, f.name)) for f in fields(self)}
        return (
            f"head {v['max_header_bytes']} in at most {v['max_headers']} lines within {v['header_timeout_s']}, "
            f"body {v['max_body_bytes']} (silent at most {v['body_timeout_s']}), keep-alive {v['keep_alive_s']}, "
            f"a stalled reader {v['write_timeout_s']}, "
            f"connections {v['max_connections_per_client']} per client and {v['max_connections']} in all"
        )


def _env_name(field_name: str) -> str:
    return f"OPENGYRE_HTTP_{field_name.upper()}"


def _shown(name: str, value: float) -> str:
    if name.endswith("_s"):
        return f"{value:g} s"
    if name.endswith("_bytes"):
        for unit, size in (("MiB", _MIB), ("KiB", _KIB)):
            if value % size == 0:
                return f"{value // size:g} {unit}"
        return f"{value} B"
    return str(value)
