"""A container healthcheck that means something: ``python -m opengyre.healthcheck PORT [URL ...]``.

Exit 0 when the gRPC service on 127.0.0.1:PORT answers health SERVING (a service answers NOT_SERVING while its
event log is unreachable) and every URL answers 2xx (the gateway's and the engine's ``/health``); else exit 1,
saying what failed. A top-level module, apart from the CLI and from ``opengyre.runtime`` (3 s of imports on a loaded
machine, past a healthcheck's timeout), so a check every few seconds costs a gRPC import (0.4 s) only.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Sequence

__all__ = ["main"]

_DEADLINE_S = 2.0


def _grpc_state(port: int) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:  # health needs no token (docs/security.md)
        try:
            h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=_DEADLINE_S)
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(h.status))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit():
        print("usage: python -m opengyre.healthcheck PORT [URL ...] (PORT 0: no gRPC check)", file=sys.stderr)
        return 2
    port, urls = int(args[0]), args[1:]
    if port:
        state = _grpc_state(port)
        if state != "SERVING":
            print(f"gRPC 127.0.0.1:{port}: {state}", file=sys.stderr)
            return 1
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=_DEADLINE_S) as r:  # loopback URLs of the stack
                r.read()
        except OSError as exc:
            print(f"{url}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
